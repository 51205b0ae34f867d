"""The admin/client RPC: method table, parameter schemas and the views it returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from masterd.api.accounts import method_table as account_methods
from masterd.api.failures import method_table as failure_methods
from masterd.api.fairshare import method_table as fairshare_methods
from masterd.api.genie import job_extras
from masterd.api.genie import method_table as genie_methods
from masterd.api.helios import job_extras as helios_job_extras
from masterd.api.helios import method_table as helios_methods
from masterd.api.inference import method_table as inference_methods
from masterd.api.lifecycle import method_table as lifecycle_methods
from masterd.api.liquid import job_extras as liquid_job_extras
from masterd.api.liquid import method_table as liquid_methods
from masterd.api.logs import method_table as logs_methods
from masterd.api.maintenance import method_table as maintenance_methods
from masterd.api.partitions import method_table as partition_methods
from masterd.api.reservations import method_table as reservation_methods
from masterd.api.visibility import check_owner, check_visible, viewer
from masterd.core.scheduler import JobError
from masterd.core.waiting import WaitExplainer
from masterd.journal.store import EventRow, Store
from masterd.journal.wire import NO_PLACEMENT_VIEW, WireCache, placement_view, spec_view
from masterd.service.bulk import BatchRefused, Refusal
from masterd.service.master import Master
from shared.model import NAME_PATTERN, Job, JobSpec, JobState
from shared.protocol import ProtocolError
from shared.rpcdoc import returns
from shared.schema import SchemaError, bounded, decode

VERSION = "0.1.0"


@dataclass(frozen=True)
class SubmitParams:
    job: JobSpec
    id: str | None = bounded(None, max_len=256)


MAX_BATCH = 10_000  # jobs in one submit_many (the 1 MiB request limit usually binds first)


@dataclass(frozen=True)
class SubmitManyParams:
    # Job specs (as `submit`'s `job`), decoded one by one so that every bad one is reported
    # by its index, not only the first.
    jobs: tuple[dict[str, Any], ...] = bounded(max_len=MAX_BATCH)
    # One entry per job: the id to use, or nil for one the master picks.
    ids: tuple[str | None, ...] | None = bounded(None, max_len=MAX_BATCH)


@dataclass(frozen=True)
class JobIdParams:
    id: str = bounded(max_len=256)


@dataclass(frozen=True)
class NodeParams:
    node: str = bounded(max_len=256)


@dataclass(frozen=True)
class DrainParams:
    node: str = bounded(max_len=256)
    # Why (shown with the node's state everywhere, kept across restarts); "" for none.
    reason: str = bounded("", max_len=256)


@dataclass(frozen=True)
class JobsParams:
    state: str | None = bounded(None, pattern="|".join(s.value for s in JobState) + "|active")
    tenant: str | None = bounded(None, pattern=NAME_PATTERN)
    node: str | None = bounded(None, pattern=NAME_PATTERN)
    limit: int = bounded(10_000, min=1, max=100_000)


@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class EventsParams:
    after: int = bounded(0, min=0)
    limit: int = bounded(1000, min=1, max=10_000)
    job: str | None = bounded(None, pattern=NAME_PATTERN)
    # The last ``tail`` rows (after the other filters) instead of the rows after ``after``.
    tail: int | None = bounded(None, min=1, max=10_000)


def event_view(e: EventRow) -> dict[str, Any]:
    return {"seq": e.seq, "time": e.time, "job": e.job_id, "node": e.node, "kind": e.kind,
            "detail": e.detail}


def job_view(job: Job, wire: WireCache | None = None) -> dict[str, Any]:
    """A job as RPCs show it. ``wire`` caches the parts that never change per job."""
    if wire is not None:
        spec, placement = wire.spec_view(job), wire.placement_view(job)
    else:
        spec = spec_view(job.spec)
        placement = placement_view(job.placement) if job.placement else NO_PLACEMENT_VIEW
    # One dict display: built per submission and per listed job.
    return {
        "id": job.id,
        "state": job.state.value,
        **spec,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "queued_s": job.queued_seconds,
        "exit_code": job.exit_code,
        "signal": job.signal,
        "reason": job.reason,
        # Why a queued job waits (a wait reason, docs/protocol.md#why-a-job-waits; "" for
        # other jobs) and who holds it ("", "user" or "admin").
        "wait": job.wait,
        "held": job.held,
        "attempts": job.attempts,
        # Times it was requeued after its node was lost or a GPU of it failed.
        "restarts": job.restarts,
        **placement,
        # When a running job reaches its time limit (start + limit), else None.
        "time_limit_at": (job.start_time + job.spec.time_limit_s
                          if job.start_time is not None and job.spec.time_limit_s is not None
                          and not job.state.terminal else None),
    }


def explained(view: dict[str, Any], job: Job, waits: WaitExplainer) -> dict[str, Any]:
    """A queued job's view with why it waits, as computed now (``wait`` and ``reason``)."""
    if job.state is JobState.QUEUED:
        view["wait"], view["reason"] = waits.why(job)
    return view


class Rpc:
    def __init__(self, master: Master) -> None:
        self.master = master
        self.methods: dict[str, tuple[type, Callable[[Any], Awaitable[Any]]]] = {
            "ping": (NoParams, self.ping),
            "submit": (SubmitParams, self.submit),
            "submit_many": (SubmitManyParams, self.submit_many),
            "cancel": (JobIdParams, self.cancel),
            "jobs": (JobsParams, self.jobs),
            "job": (JobIdParams, self.job),
            "nodes": (NoParams, self.nodes),
            "drain": (DrainParams, self.drain),
            "undrain": (NodeParams, self.undrain),
            "node": (NodeParams, self.node),
            "events": (EventsParams, self.events),
        }
        self._wants_params = frozenset({"submit"})  # handlers given the raw params too
        # The placement RPC for inference services (SODA §V-D).
        self.methods.update(inference_methods(master.features.inference))
        # GENIE's model database and profiler, SODA's pools.
        self.methods.update(genie_methods(master))
        # Liquid's resource model.
        self.methods.update(liquid_methods(master))
        self.methods.update(helios_methods(master))  # QSSF's estimator, energy saving
        self.methods.update(logs_methods(master))  # jobs' output, relayed from their nodes
        # Holds, releases and updates (masterd.features.holds).
        self.methods.update(lifecycle_methods(master.features.controls, self._view))
        # GPUs returned to service (masterd.features.gpufaults).
        self.methods.update(failure_methods(master.features.gpufaults))
        # Fair share and accounting (masterd.features.fairshare).
        self.methods.update(fairshare_methods(master.features.fairshare))
        # Accounts, quotas and caps (masterd.features.accounts).
        self.methods.update(account_methods(master.features.accounts))
        self.methods.update(maintenance_methods(master.features.maintenance))
        self.methods.update(reservation_methods(master.features.reservations))
        self.methods.update(partition_methods(master.features.partitions,
                                              master.features.priority_classes))

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        entry = self.methods.get(method)
        if entry is None:
            known = ", ".join(sorted(self.methods))
            raise ProtocolError("unknown_method", f"unknown method {method!r}; known: {known}")
        schema, handler = entry
        try:
            args = decode(schema, params, "params")
        except SchemaError as exc:
            raise ProtocolError("invalid_params", str(exc)) from None
        try:
            if method in self._wants_params:
                return await handler(args, params)  # type: ignore[call-arg]
            return await handler(args)
        except JobError as exc:
            raise ProtocolError(exc.code, str(exc)) from None
        except ValueError as exc:
            raise ProtocolError("invalid_params", str(exc)) from None

    async def _job(self, job_id: str) -> Job:
        """The job in memory or, for an ended job the master forgot, as journalled."""
        job = await self.master.find_job(job_id)
        if job is None:
            raise JobError("unknown_job", f"job {job_id!r} does not exist")
        return job

    def _view(self, job: Job) -> dict[str, Any]:
        """A job's view with why it waits, when it waits."""
        return explained(job_view(job, self._wire_for(job)), job,
                         WaitExplainer(self.master.core))

    def _wire_for(self, job: Job) -> WireCache | None:
        """The per-job wire cache, unless the job is no longer in memory (a cancel can end
        and forget it at once): caching its view would bring back what forgetting dropped."""
        return self.master.journal.wire if job.id in self.master.core.jobs else None

    @returns("`version`: the master's version; `policy`: its scheduling policy.")
    async def ping(self, _: NoParams) -> dict[str, Any]:
        """Whether the master answers, and its version and policy."""
        return {"version": VERSION, "policy": self.master.core.policy.name}

    @returns("`job`: the new job's [job view](#job-view), state `queued`.",
             ("unknown_user", "user_refused", "unsatisfiable", "invalid_job", "duplicate_job",
              "not_leader", "forbidden",
              # No partition it names (or the default) admits it: shared/partitions.py.
              "invalid_partition",
              # A priority class that does not exist (shared/priorityclasses.py).
              "invalid_priority_class",
              # A reservation that does not exist or is not the job's user's or account's.
              "invalid_reservation",
              # A dependency (`after`) naming no known job or array, closing a cycle, or an
              # aftercorr without a task to pair with (masterd.core.dependencies).
              "unknown_dependency", "dependency_cycle", "invalid_dependency"))
    async def submit(self, p: SubmitParams, params: dict[str, Any]) -> dict[str, Any]:
        """Submit one job; journalled before the reply. ``id`` makes a retry idempotent."""
        # The job map as sent decodes to exactly this spec (it just did), so it serves as the
        # spec's wire form for the journal and the nodes without encoding the spec again.
        job = await self.master.submit(p.job, p.id, wire_spec=params["job"])
        # Built, not cached: a submission's view is sent once, and most jobs are never
        # listed while queued (the cache fills when they are).
        return {"job": job_view(job)}

    @returns("`jobs`: the new jobs' [job views](#job-view), in the order given. Refused: "
             "`batch_refused`, with `detail` = `{jobs: N, refused: [{index, code, message}], "
             "accepted: [ids]}` (`accepted` is empty unless the store failed part-way).",
             ("batch_refused", "not_leader"))
    async def submit_many(self, p: SubmitManyParams) -> dict[str, Any]:
        """Many jobs in one call and one journal transaction, all or none: a refused job
        refuses the batch, and the error (``batch_refused``) lists every refused job by
        index in its message and in ``detail.refused``."""
        if not p.jobs:
            raise ProtocolError("invalid_params", "params.jobs: must hold at least one job")
        if p.ids is not None and len(p.ids) != len(p.jobs):
            raise ProtocolError("invalid_params", f"params.ids: has {len(p.ids)} entries for "
                                f"{len(p.jobs)} jobs (give an id or nil for each job)")
        ids = list(p.ids) if p.ids is not None else [None] * len(p.jobs)
        specs: list[JobSpec] = []
        refused: list[Refusal] = []
        decoded: list[int] = []  # index in the batch of each spec
        for index, raw in enumerate(p.jobs):
            try:
                specs.append(decode(JobSpec, raw, f"jobs[{index}]"))
                decoded.append(index)
            except SchemaError as exc:
                refused.append(Refusal(index, "invalid_params", str(exc)))
        try:
            if refused:  # the others are checked too: the client hears of every bad job
                more = self.master.batch_refusals(specs, [ids[i] for i in decoded])
                refused += [Refusal(decoded[r.index], r.code, r.message) for r in more]
                raise BatchRefused(sorted(refused, key=lambda r: r.index), len(p.jobs))
            # Each map as sent decodes to its spec: it serves as the spec's wire form.
            jobs = await self.master.submit_many(specs, ids, wire_specs=p.jobs)
        except BatchRefused as exc:
            raise ProtocolError(exc.code, str(exc), exc.detail()) from None
        return {"jobs": [job_view(job) for job in jobs]}

    @returns("`job`: the job's [job view](#job-view) (queued jobs end `cancelled` at once; "
             "running ones are stopped: SIGTERM, SIGKILL after the job's grace: its "
             "`stop.grace_s`, else `stop_grace_s`, at most `max_grace_s`).",
             ("unknown_job", "job_finished", "forbidden"))
    async def cancel(self, p: JobIdParams) -> dict[str, Any]:
        """Cancel a queued or running job."""
        found = await self._job(p.id)
        check_owner(found, "cancel")
        if p.id not in self.master.core.jobs:
            # Only ended jobs are ever forgotten: the answer the core gives for one in memory.
            raise JobError("job_finished", f"job {p.id} already ended ({found.state.value})")
        job = await self.master.cancel(p.id)
        return {"job": job_view(job, self._wire_for(job))}

    @returns("`jobs`: [job views](#job-view) of the jobs in memory that match the filters.")
    async def jobs(self, p: JobsParams) -> dict[str, Any]:
        """Jobs in the master's memory: every queued and active one, and the newest
        ``finished_jobs_in_memory`` ended ones (older ones: ``job`` and ``events``). A client
        credential sees its own user's jobs and, with accounts on, its accounts' and their
        sub-accounts' jobs."""
        out = []
        # A client lists its own user's jobs and its accounts' (and sub-accounts') only.
        who = viewer(self.master.features.accounts.visible_accounts)
        waits: WaitExplainer | None = None  # made once per listing, if a queued job is listed
        # Starting/running jobs are a small index of their own; scanning every job ever
        # submitted for them made each such list cost O(all jobs).
        pool = (self.master.core.active_jobs().values()
                if p.state in ("active", "starting", "running")
                else self.master.core.jobs.values())
        for job in pool:
            if p.state == "active":
                if job.state.terminal or job.state is JobState.QUEUED:
                    continue
            elif p.state and job.state.value != p.state:
                continue
            if p.tenant and job.spec.tenant != p.tenant:
                continue
            if who is not None and not who.sees(job):
                continue
            if p.node and not (job.placement and p.node in job.placement.nodes):
                continue
            view = job_view(job, self.master.journal.wire)
            if job.state is JobState.QUEUED:
                waits = waits or WaitExplainer(self.master.core)
                explained(view, job, waits)
            out.append(view)
            if len(out) >= p.limit:
                break
        return {"jobs": out}

    @returns("`job`: its [job view](#job-view); `events`: its journal rows `{time, node, "
             "kind, detail}`, oldest first; `prediction`: GENIE's view (model, fallback, "
             "predicted latency, ECT, waiting allowance) or nil; `metrics`: the latest "
             "values it reported, `{name: {value, last, count}}`.", ("unknown_job",
                                                                      "forbidden"))
    async def job(self, p: JobIdParams) -> dict[str, Any]:
        """One job, also one ended long ago (read from the journal), with its events."""
        job = await self._job(p.id)
        check_visible(job, "see", self.master.features.accounts.visible_accounts)
        events = await self.master.journal.call(Store.events, job.id)
        return {
            "job": self._view(job),
            "events": [
                {"time": e.time, "node": e.node, "kind": e.kind, "detail": e.detail}
                for e in events
            ],
            **job_extras(self.master, job),
            **await liquid_job_extras(self.master, job),
            **helios_job_extras(self.master, job),
        }

    @returns("`nodes`: per node `name`, `status` (`ready`, `drained`, `disconnected`, "
             "`unreachable`, `down`), `address`, `gpu_model`, `gpus`, `gpus_free`, "
             "`gpus_unhealthy`, `cpus`, `cpus_free`, `memory_mib`, `memory_free_mib`, `jobs` "
             "(ids), `gpu_detail` (each GPU's inventory and `utilization_pct`), `features` "
             "(the node's, which jobs select by: `--constraint`) and "
             "`conditions`: why it takes no new work (`kind`: `disconnected`, `drained` or "
             "`power`; `reason`, a sentence; `since`), empty when it is schedulable.")
    async def nodes(self, _: NoParams) -> dict[str, Any]:
        """Every registered node with its status and free resources. A client credential
        sees the ids of the jobs it may see only (the free resources show what others hold)."""
        out = []
        who = viewer(self.master.features.accounts.visible_accounts)
        jobs = self.master.core.jobs
        for view in self.master.core.cluster.views():
            inv = view.inventory
            util = self.master.gpu_util.get(view.name, {})
            out.append({
                "name": view.name,
                "status": self.master.node_status(view.name),
                "address": inv.address,
                "gpu_model": inv.gpu_model,
                "gpus": len(inv.gpus),
                "gpus_free": len(view.free_gpus),
                "gpus_unhealthy": [g.index for g in inv.gpus if not g.healthy],
                "cpus": len(inv.cpus),
                "cpus_free": len(view.free_cpus),
                "memory_mib": inv.memory_mib,
                "memory_free_mib": view.free_memory_mib,
                "jobs": [j for j in self.master.core.cluster.jobs_on(view.name)
                         if who is None or (j in jobs and who.sees(jobs[j]))],
                "gpu_detail": [
                    dict(dataclasses.asdict(g), utilization_pct=(
                        util[g.index].utilization_pct if g.index in util else None))
                    for g in inv.gpus
                ],
                "features": list(inv.features),
                # The reservations not over yet that hold it.
                "reservations": [h.name for h in inv.reservations],
                "conditions": [{"kind": c.kind, "reason": c.reason, "since": c.since}
                               for c in self.master.core.node_conditions(view.name)],
            })
        return {"nodes": out}

    @returns("`node` and its `status` (`drained`): running jobs stay, nothing new starts.",
             ("unknown_node",))
    async def drain(self, p: DrainParams) -> dict[str, Any]:
        """Stop placing jobs on a node, with a reason for its users and other operators."""
        await self.master.set_drained(p.node, True, " ".join(p.reason.split()))
        return {"node": p.node, "status": self.master.node_status(p.node)}

    @returns("`node` and its `status`.", ("unknown_node",))
    async def undrain(self, p: NodeParams) -> dict[str, Any]:
        """Place jobs on a drained node again."""
        await self.master.set_drained(p.node, False)
        return {"node": p.node, "status": self.master.node_status(p.node)}

    @returns("`node`: as one entry of `nodes`, each GPU with its holder `job` and, out of "
             "service, its `fault` (`{xid, reason, fatal, since}`); `jobs`: the "
             "job parts placed there (`id`, `state`, `tenant`, `user`, `qos`, `gpus`, "
             "`cpus`, `memory_mib`); `rdt`: `{cat, mba, mbm, mba_mbps}`; once the node "
             "reported them, `net_partition` (SODA's network partition) and `memory_bandwidth` "
             "(`used_gbps`, `limit_gbps`, `headroom_gbps` for inference CPU replicas, "
             "`age_s`).", ("unknown_node",))
    async def node(self, p: NodeParams) -> dict[str, Any]:
        """One node in detail: its GPUs with utilisation and holder, its jobs with the cores
        and GPUs each holds there, and its RDT capabilities."""
        views = (await self.nodes(NoParams()))["nodes"]
        found = next((v for v in views if v["name"] == p.node), None)
        if found is None:
            raise JobError("unknown_node", f"node {p.node!r} is not registered")
        jobs = []
        holder: dict[int, str] = {}
        for job_id in found["jobs"]:
            job = self.master.core.jobs.get(job_id)
            if job is None or job.placement is None:
                continue
            for alloc in job.placement.allocations:
                if alloc.node != p.node:
                    continue
                holder.update({g: job.id for g in alloc.gpus})
                jobs.append({"id": job.id, "state": job.state.value, "tenant": job.spec.tenant,
                             "user": job.spec.user, "qos": job.spec.qos.value,
                             "gpus": list(alloc.gpus), "cpus": list(alloc.cpus),
                             "memory_mib": alloc.memory_mib})
        faults = self.master.features.gpufaults
        for gpu in found["gpu_detail"]:
            gpu["job"] = holder.get(gpu["index"])
            gpu["fault"] = faults.of(p.node, gpu["index"])  # out of service: why, since when
        view = self.master.core.cluster.node(p.node)
        assert view is not None
        reply = {"node": found, "jobs": jobs, "rdt": dataclasses.asdict(view.inventory.rdt)}
        partition = self.master.features.net_partitions.of(p.node)
        if partition is not None:  # SODA's network partition, once the node reported one
            reply["net_partition"] = {k: v for k, v in partition.items() if k != "jobs"} | {
                "jobs": ",".join(partition["jobs"]) or "-"}
        bandwidth = self.master.features.inference.bandwidth_of(p.node)
        if bandwidth is not None:  # the node's contention monitor measures it (MBM)
            reply["memory_bandwidth"] = bandwidth
        return reply

    @returns("`events`: journal rows `{seq, time, job, node, kind, detail}` oldest first; "
             "`last`: the cursor to pass as `after` next time.")
    async def events(self, p: EventsParams) -> dict[str, Any]:
        """Journal rows after sequence number ``after`` (or the newest ``tail`` ones), oldest
        first; ``last`` is the cursor to pass as ``after`` next time. A client follows one
        job's rows (``job``), of a job it may see (its own, or its accounts')."""
        accounts_of = self.master.features.accounts.visible_accounts
        if viewer(accounts_of) is not None:
            if p.job is None:
                raise ProtocolError("forbidden", "a client reads the events of one job at a "
                                    "time: give job (trellisctl events --job ID)")
            check_visible(await self._job(p.job), "follow", accounts_of)
        if p.tail is not None:
            rows = await self.master.journal.call(Store.events_tail, p.job, p.tail)
        else:
            rows = await self.master.journal.call(Store.events, p.job, p.after, p.limit)
        return {"events": [event_view(e) for e in rows],
                "last": rows[-1].seq if rows else p.after}
