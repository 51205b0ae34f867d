"""Typed methods of the SDK: every RPC that trellisctl uses, taking and returning dataclasses
(``shared.model.JobSpec`` in, ``shared.views`` out) instead of hand-built maps.

Each call is written once, as an :class:`RpcCall` (method, params, how to read the result);
:class:`TypedCalls` runs it on the synchronous clients (``MasterClient``, trellisctl's
``FailoverClient``) and :class:`AsyncTypedCalls` on ``AsyncMasterClient``. Replies are
decoded with the schema code that checks every request (``shared.views.decode_view``), so a
reply that does not match what docs/protocol.md says raises ``SchemaError`` naming the field.

Nothing heavy is imported here at module level: trellisctl imports the clients on every start
(bench/cli_startup.py), and the model and schema modules load only when a typed call is made.
"""

from __future__ import annotations

# Not `from typing import TYPE_CHECKING`, no dataclasses: typing and dataclasses (with the
# inspect module it loads) cost trellisctl 10 ms a start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, Generic, TypeVar

    from shared.model import JobSpec
    from shared.views import EventPage, JobDetail, JobView, MasterInfo, NodeDetail, NodeView

    T = TypeVar("T")

    class RpcCall(Generic[T]):
        method: str
        params: dict[str, Any]
        read: Callable[[Any], T]

        def __init__(self, method: str, params: dict[str, Any],
                     read: Callable[[Any], T]) -> None: ...
else:
    class RpcCall:
        """One RPC: its method, its parameters, and how to read its result."""

        __slots__ = ("method", "params", "read")

        def __init__(self, method, params, read):
            self.method = method
            self.params = params
            self.read = read


def _view(name: str, key: str | None = None, many: bool = False) -> Callable[[Any], Any]:
    """A reader of ``result[key]`` (the whole result without a key) as ``shared.views.NAME``,
    or a list of them."""
    def read(result: Any) -> Any:
        import shared.views as views

        cls = getattr(views, name)
        data = result if key is None else _field(result, key)
        if many:
            if not isinstance(data, list):
                from shared.schema import SchemaError

                raise SchemaError(f"result.{key}", "expected a list")
            return [views.decode_view(cls, item, f"result.{key}[{i}]")
                    for i, item in enumerate(data)]
        return views.decode_view(cls, data, f"result.{key}" if key else "result")
    return read


def _field(result: Any, key: str) -> Any:
    if not isinstance(result, dict) or key not in result:
        from shared.schema import SchemaError

        raise SchemaError("result", f"the reply has no {key!r}")
    return result[key]


def _spec(spec: JobSpec) -> dict[str, Any]:
    from shared.schema import encode

    return encode(spec)


def _given(**params: Any) -> dict[str, Any]:
    """Only the parameters the caller gave (None: the master's default)."""
    return {k: v for k, v in params.items() if v is not None}


class Calls:
    """Every typed call, once; the clients below run them."""

    @staticmethod
    def ping() -> RpcCall[MasterInfo]:
        return RpcCall("ping", {}, _view("MasterInfo"))

    @staticmethod
    def submit(spec: JobSpec, id: str | None = None, account: str | None = None
               ) -> RpcCall[JobView]:
        job = _spec(spec)
        if account is not None:  # the job's account (Slurm's --account) is its spec's tenant
            job["tenant"] = account
        return RpcCall("submit", _given(job=job, id=id), _view("JobView", "job"))

    @staticmethod
    def accounts() -> RpcCall[list[dict[str, Any]]]:
        return RpcCall("account_list", {}, lambda r: list(_field(r, "accounts")))

    @staticmethod
    def account(name: str) -> RpcCall[dict[str, Any]]:
        return RpcCall("account_show", {"name": name}, lambda r: dict(_field(r, "account")))

    @staticmethod
    def submit_many(specs: Sequence[JobSpec], ids: Sequence[str | None] | None = None
                    ) -> RpcCall[list[JobView]]:
        params: dict[str, Any] = {"jobs": [_spec(s) for s in specs]}
        if ids is not None:
            params["ids"] = list(ids)
        return RpcCall("submit_many", params, _view("JobView", "jobs", many=True))

    @staticmethod
    def cancel(job_id: str) -> RpcCall[JobView]:
        return RpcCall("cancel", {"id": job_id}, _view("JobView", "job"))

    @staticmethod
    def jobs(state: str | None = None, tenant: str | None = None, node: str | None = None,
             limit: int | None = None) -> RpcCall[list[JobView]]:
        return RpcCall("jobs", _given(state=state, tenant=tenant, node=node, limit=limit),
                       _view("JobView", "jobs", many=True))

    @staticmethod
    def job(job_id: str) -> RpcCall[JobDetail]:
        return RpcCall("job", {"id": job_id}, _view("JobDetail"))

    @staticmethod
    def nodes() -> RpcCall[list[NodeView]]:
        return RpcCall("nodes", {}, _view("NodeView", "nodes", many=True))

    @staticmethod
    def node(name: str) -> RpcCall[NodeDetail]:
        return RpcCall("node", {"node": name}, _view("NodeDetail"))

    @staticmethod
    def drain(name: str, reason: str = "") -> RpcCall[str]:
        params = {"node": name, "reason": reason} if reason else {"node": name}
        return RpcCall("drain", params, lambda r: str(_field(r, "status")))

    @staticmethod
    def undrain(name: str) -> RpcCall[str]:
        return RpcCall("undrain", {"node": name}, lambda r: str(_field(r, "status")))

    @staticmethod
    def hold(job_id: str) -> RpcCall[JobView]:
        return RpcCall("hold", {"id": job_id}, _view("JobView", "job"))

    @staticmethod
    def release(job_id: str) -> RpcCall[JobView]:
        return RpcCall("release", {"id": job_id}, _view("JobView", "job"))

    @staticmethod
    def update(job_id: str, qos: str | None = None, time_limit_s: int | None = None,
               priority: int | None = None) -> RpcCall[JobView]:
        return RpcCall("update", _given(id=job_id, qos=qos, time_limit_s=time_limit_s,
                                        priority=priority), _view("JobView", "job"))

    @staticmethod
    def gpu_reset(node: str, index: int) -> RpcCall[dict[str, Any] | None]:
        return RpcCall("gpu_reset", {"node": node, "index": index},
                       lambda r: _field(r, "was"))

    @staticmethod
    def events(after: int = 0, limit: int | None = None, job: str | None = None,
               tail: int | None = None) -> RpcCall[EventPage]:
        return RpcCall("events", _given(after=after, limit=limit, job=job, tail=tail),
                       _view("EventPage"))

    @staticmethod
    def share() -> RpcCall[list[dict[str, Any]]]:
        return RpcCall("share", {}, lambda r: _field(r, "accounts"))

    @staticmethod
    def report(by: str = "account", since: float | None = None,
               until: float | None = None) -> RpcCall[list[dict[str, Any]]]:
        return RpcCall("report", _given(by=by, since=since, until=until),
                       lambda r: _field(r, "rows"))


class TypedCalls:
    """Typed methods for a synchronous client: it provides ``call(method, params)``."""

    call: Callable[..., Any]

    def _run(self, rpc: RpcCall[T]) -> T:
        return rpc.read(self.call(rpc.method, rpc.params))

    def ping(self) -> MasterInfo:
        """The master's version and scheduling policy."""
        return self._run(Calls.ping())

    def submit(self, spec: JobSpec, id: str | None = None,
               account: str | None = None) -> JobView:
        """Submit one job (journalled before the reply); ``id`` makes a retry idempotent."""
        return self._run(Calls.submit(spec, id, account))

    def submit_many(self, specs: Sequence[JobSpec], ids: Sequence[str | None] | None = None
                    ) -> list[JobView]:
        """Many jobs in one call, all or none (RpcError ``batch_refused`` lists refusals)."""
        return self._run(Calls.submit_many(specs, ids))

    def cancel(self, job_id: str) -> JobView:
        """Cancel a queued or running job."""
        return self._run(Calls.cancel(job_id))

    def jobs(self, state: str | None = None, tenant: str | None = None,
             node: str | None = None, limit: int | None = None) -> list[JobView]:
        """Jobs in the master's memory matching the filters (``state`` may be ``active``)."""
        return self._run(Calls.jobs(state, tenant, node, limit))

    def job(self, job_id: str) -> JobDetail:
        """One job (also one ended long ago) with its journal rows (trellisctl show)."""
        return self._run(Calls.job(job_id))

    def nodes(self) -> list[NodeView]:
        """Every registered node with its status and free resources."""
        return self._run(Calls.nodes())

    def node(self, name: str) -> NodeDetail:
        """One node with the job parts placed there."""
        return self._run(Calls.node(name))

    def drain(self, name: str, reason: str = "") -> str:
        """Stop placing jobs on a node (with why); returns its status."""
        return self._run(Calls.drain(name, reason))

    def undrain(self, name: str) -> str:
        """Place jobs on a drained node again; returns its status."""
        return self._run(Calls.undrain(name))

    def hold(self, job_id: str) -> JobView:
        """Keep a queued job from starting until it is released."""
        return self._run(Calls.hold(job_id))

    def release(self, job_id: str) -> JobView:
        """Let a held job be scheduled again."""
        return self._run(Calls.release(job_id))

    def update(self, job_id: str, qos: str | None = None, time_limit_s: int | None = None,
               priority: int | None = None) -> JobView:
        """Change a job's QoS class, time limit or priority (a user may only lower them)."""
        return self._run(Calls.update(job_id, qos, time_limit_s, priority))

    def accounts(self) -> list[dict[str, Any]]:
        return self._run(Calls.accounts())

    def account(self, name: str) -> dict[str, Any]:
        return self._run(Calls.account(name))

    def gpu_reset(self, node: str, index: int) -> dict[str, Any] | None:
        """(Admins) return a GPU out of service to service; returns the fault it was held
        out for (``{xid, reason, fatal, since}``), or None when only its node held it."""
        return self._run(Calls.gpu_reset(node, index))

    def events(self, after: int = 0, limit: int | None = None, job: str | None = None,
               tail: int | None = None) -> EventPage:
        """Journal rows after cursor ``after`` (or the newest ``tail``), oldest first."""
        return self._run(Calls.events(after, limit, job, tail))

    def share(self) -> list[dict[str, Any]]:
        """Fair share: one row per account the caller may see (``account``, ``parent``,
        ``shares``, ``norm_shares``, ``raw_usage``, ``norm_usage``, ``effective_usage``,
        ``factor``), parents first."""
        return self._run(Calls.share())

    def report(self, by: str = "account", since: float | None = None,
               until: float | None = None) -> list[dict[str, Any]]:
        """Accounting rows over ``[since, until)`` (Unix seconds; default the last 30 days)
        by ``account``, ``user`` or ``gpu-model``: see docs/governance.md."""
        return self._run(Calls.report(by, since, until))


class AsyncTypedCalls:
    """:class:`TypedCalls` for the asyncio client (``async def call(method, params)``)."""

    call: Callable[..., Any]

    async def _run(self, rpc: RpcCall[T]) -> T:
        return rpc.read(await self.call(rpc.method, rpc.params))

    async def ping(self) -> MasterInfo:
        return await self._run(Calls.ping())

    async def submit(self, spec: JobSpec, id: str | None = None,
                     account: str | None = None) -> JobView:
        return await self._run(Calls.submit(spec, id, account))

    async def submit_many(self, specs: Sequence[JobSpec],
                          ids: Sequence[str | None] | None = None) -> list[JobView]:
        return await self._run(Calls.submit_many(specs, ids))

    async def cancel(self, job_id: str) -> JobView:
        return await self._run(Calls.cancel(job_id))

    async def jobs(self, state: str | None = None, tenant: str | None = None,
                   node: str | None = None, limit: int | None = None) -> list[JobView]:
        return await self._run(Calls.jobs(state, tenant, node, limit))

    async def job(self, job_id: str) -> JobDetail:
        return await self._run(Calls.job(job_id))

    async def nodes(self) -> list[NodeView]:
        return await self._run(Calls.nodes())

    async def node(self, name: str) -> NodeDetail:
        return await self._run(Calls.node(name))

    async def drain(self, name: str, reason: str = "") -> str:
        return await self._run(Calls.drain(name, reason))

    async def undrain(self, name: str) -> str:
        return await self._run(Calls.undrain(name))

    async def hold(self, job_id: str) -> JobView:
        return await self._run(Calls.hold(job_id))

    async def release(self, job_id: str) -> JobView:
        return await self._run(Calls.release(job_id))

    async def update(self, job_id: str, qos: str | None = None,
                     time_limit_s: int | None = None, priority: int | None = None) -> JobView:
        return await self._run(Calls.update(job_id, qos, time_limit_s, priority))

    async def accounts(self) -> list[dict[str, Any]]:
        return await self._run(Calls.accounts())

    async def account(self, name: str) -> dict[str, Any]:
        return await self._run(Calls.account(name))

    async def gpu_reset(self, node: str, index: int) -> dict[str, Any] | None:
        return await self._run(Calls.gpu_reset(node, index))

    async def events(self, after: int = 0, limit: int | None = None, job: str | None = None,
                     tail: int | None = None) -> EventPage:
        return await self._run(Calls.events(after, limit, job, tail))

    async def share(self) -> list[dict[str, Any]]:
        return await self._run(Calls.share())

    async def report(self, by: str = "account", since: float | None = None,
                     until: float | None = None) -> list[dict[str, Any]]:
        return await self._run(Calls.report(by, since, until))
