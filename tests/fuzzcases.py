"""Hypothesis strategies for fuzzing a real master's two endpoints.

Shared by the CI fuzz test (tests/e2e/test_fuzz.py, a few thousand cases) and the fuzz bench
(bench/fuzz.py, 100,000 and more). Two kinds of input:

- random: bytes that are no msgpack, msgpack of any shape, envelopes with a field replaced;
- near-valid: parameter maps and node-event bodies derived from the schema dataclass of each
  RPC method and node event (its type hints and bounds: ``shared.schema``), valid values on
  and inside each bound, then zero to three mutations: a field replaced by a hostile value
  (wrong type, an integer past 64 bits or at a bound's edge, negative, NaN, a long string,
  deep or wide junk), a required field dropped, an unknown field added, nested maps mutated
  the same way.

Names come partly from small pools (``JOB_IDS``, ``HELLO_NAMES``...) so that near-valid cases
meet jobs and nodes that exist and reach the code past the "unknown" checks.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import msgpack
from hypothesis import strategies as st

from shared.messages import NODE_EVENTS, Hello
from shared.model import CpuCore, GpuInfo, NodeInventory
from shared.protocol import encode_frame
from shared.relay import STREAM_FRAMES
from shared.schema import Bounds, encode

# -- pools of names that exist ------------------------------------------------------------------

# Ids the fuzzed submissions use now and then, and that node events report on.
JOB_IDS = tuple(f"fz-{i}" for i in range(12))
# Nodes that fuzzed hellos register (never a driver's own node: a hello under that name would
# replace the driver's session).
HELLO_NAMES = tuple(f"trellis-test-fuzz-h{i}" for i in range(6))
NODE_PREFIX = "trellis-test-fuzz-n"  # the drivers' own nodes: NODE_PREFIX + number
SERVICES = ("fz-svc", "fz-svc-2")
ACCOUNTS = ("root", "fz-acct", "fz-acct-2")
USERS = ("nobody", "root", "fz_user")
NAMES = (*JOB_IDS, *HELLO_NAMES, f"{NODE_PREFIX}0", *SERVICES, *ACCOUNTS, *USERS, "n1",
         "fuzz", "active", "running", "queued")
NODES = (f"{NODE_PREFIX}0", f"{NODE_PREFIX}1", *HELLO_NAMES, "n1")

# -- random values -------------------------------------------------------------------------------

INT_EDGES = (0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, (1 << 62) - 1, 1 << 62,
             (1 << 62) + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**63) + 1)  # msgpack's range
FLOAT_EDGES = (math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e308, 1e-9, 0.5, 1e15 + 0.5,
               2.0**63, 2.0**64)
STRING_EDGES = ("", "..", "/", "a/../b", "\x00", "x" * 300, "x" * 5000, "é" * 2100, "-",
                "a" * 64, "a" * 65, "A", "\n", " ", "%s%n", "${HOME}", "$(id)", "\u202e",
                "/dev/zero", "/etc/passwd", "nobody", "root")

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.binary(max_size=40), st.sampled_from(["..", "/", "a/../b", "\x00", "x" * 300, ""]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=8)


@st.composite
def junk(draw: st.DrawFn) -> Any:
    """Deep or wide containers: nesting up to past the frame limit (32), long lists."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        value: Any = draw(scalars)
        for _ in range(draw(st.integers(1, 40))):
            value = [value] if draw(st.booleans()) else {"k": value}
        return value
    if kind == 1:
        return [draw(scalars)] * draw(st.integers(100, 5000))
    if kind == 2:
        return {f"k{i}": i for i in range(draw(st.integers(50, 2000)))}
    return draw(st.binary(min_size=1000, max_size=20_000))


hostile = st.one_of(
    values, st.sampled_from(INT_EDGES), st.sampled_from(FLOAT_EDGES),
    st.sampled_from(STRING_EDGES), st.sampled_from(NAMES), junk(),
    st.integers(-1000, 1000), st.text(min_size=1, max_size=300),
)

# -- schema-driven valid values ------------------------------------------------------------------

MAX_ITEMS = 4  # items of a generated list or map (the schema's limits are far larger)
# Field overrides: (dataclass, field) -> a strategy of valid-looking values.
OVERRIDES: dict[tuple[str, str], st.SearchStrategy[Any]] = {
    ("NodeInventory", "name"): st.sampled_from(HELLO_NAMES),
    ("NodeInventory", "address"): st.just("127.0.0.1"),
    ("JobSpec", "user"): st.sampled_from(USERS),
    ("JobSpec", "command"): st.just(["true"]),
    ("SubmitParams", "id"): st.none() | st.sampled_from(JOB_IDS),
    ("LogsParams", "wait_s"): st.sampled_from([0.0, 0.01]),
    ("AccountUserParams", "user"): st.sampled_from(USERS),
    ("NodeParams", "node"): st.sampled_from(NODES),
    ("GpuResetParams", "node"): st.sampled_from(NODES),
    ("JobIdParams", "id"): st.sampled_from(JOB_IDS),
    ("HoldParams", "id"): st.sampled_from(JOB_IDS),
    ("UpdateParams", "id"): st.sampled_from(JOB_IDS),
    # Job specs a master may accept: small shapes (mutations bring the edges).
    ("JobSpec", "name"): st.sampled_from(["fuzz", "fz", "a"]),
    ("JobSpec", "kind"): st.sampled_from(["cpu", "cpu", "training", "inference"]),
    ("JobSpec", "gpus"): st.integers(0, 2),
    ("JobSpec", "cpus"): st.integers(0, 2),
    ("JobSpec", "memory_mib"): st.sampled_from([0, 64, 1024]),
    ("RegisterServiceParams", "service"): st.sampled_from(SERVICES),
    ("RegisterServiceParams", "user"): st.sampled_from(USERS),
    ("RegisterServiceParams", "command"): st.just(("true",)),
    ("ServiceParams", "service"): st.sampled_from(SERVICES),
    ("ReportLoadParams", "service"): st.sampled_from(SERVICES),
    ("ProfileParams", "user"): st.sampled_from(USERS),
    ("ProfileParams", "command"): st.just(("true",)),
}


def _job_spec_fixup(data: dict[str, Any]) -> None:
    """A training or inference job (the default kind) needs a GPU."""
    if data.get("kind", "training") != "cpu" and not data.get("gpus"):
        data["gpus"] = 1


def _account_fixup(data: dict[str, Any]) -> None:
    """Accounts that take the user fuzzed jobs run as: once one exists, a user in none is
    refused every submission."""
    users = data.setdefault("users", ["nobody"])
    if isinstance(users, list) and "nobody" in users:
        data.setdefault("default_for", ["nobody"])


# Changes that make a generated map of a class pass its cross-field checks more often.
FIXUPS: dict[str, Callable[[dict[str, Any]], None]] = {"JobSpec": _job_spec_fixup,
                                                       "Account": _account_fixup}


def _ints(bounds: Bounds | None) -> st.SearchStrategy[int]:
    lo = -(2**63) if bounds is None or bounds.min is None else math.ceil(bounds.min)
    hi = 2**63 - 1 if bounds is None or bounds.max is None else math.floor(bounds.max)
    near = st.integers(max(lo, min(hi, -3)), min(hi, max(lo, 64)))
    return st.one_of(near, st.sampled_from(sorted({lo, hi, min(hi, lo + 1), max(lo, hi - 1)})),
                     st.integers(lo, hi))


def _floats(bounds: Bounds | None) -> st.SearchStrategy[float]:
    lo = None if bounds is None or bounds.min is None else float(bounds.min)
    hi = None if bounds is None or bounds.max is None else float(bounds.max)
    edges = [v for v in (lo, hi) if v is not None]
    inner = st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)
    return st.one_of(inner, st.sampled_from(edges)) if edges else inner


def _strings(bounds: Bounds | None) -> st.SearchStrategy[str]:
    limit = bounds.max_len if bounds is not None and bounds.max_len is not None else 4096
    regex = bounds.regex if bounds is not None else None
    pool = [n for n in NAMES if len(n) <= limit and (regex is None or regex.fullmatch(n))]
    if regex is not None:
        # Patterns are anchored whole: a generated match may still run past max_len.
        made = st.from_regex(regex, fullmatch=True).filter(lambda s: len(s) <= limit)
    else:
        made = st.text(max_size=min(limit, 40))
    return st.one_of(st.sampled_from(pool), made) if pool else made


@cache
def valid(tp: Any, bounds: Bounds | None = None, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of type ``tp`` within ``bounds``, in wire form (what msgpack would carry)."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return st.one_of([st.none() if a is type(None) else valid(a, bounds, depth)
                          for a in get_args(tp)])
    if tp is Any:
        return values
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return st.deferred(lambda: valid_map(tp, depth + 1))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from([m.value for m in tp])
    items = 0 if depth > 3 else MAX_ITEMS
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return st.tuples(*(valid(a, None, depth + 1) for a in args)).map(list)
        item = valid(args[0], bounds, depth + 1) if args else values
        return st.lists(item, max_size=items)
    if origin in (dict, Mapping) or tp is dict:
        kt, vt = get_args(tp) or (Any, Any)
        keys = _strings(None) | st.sampled_from(NAMES) if kt in (str, Any) else valid(kt)
        return st.dictionaries(keys, valid(vt, None, depth + 1), max_size=items)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return _ints(bounds)
    if tp is float:
        return _floats(bounds)
    if tp is str:
        return _strings(bounds)
    if tp is bytes:
        return st.binary(max_size=64)
    return values


@cache
def valid_map(cls: type, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """A map of ``cls``'s fields: every required one, up to three of the others."""
    hints = get_type_hints(cls)
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        strategy = OVERRIDES.get((cls.__name__, f.name))
        if strategy is None:
            strategy = valid(hints[f.name], f.metadata.get("bounds"), depth)
        missing = (f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
        (required if missing else optional)[f.name] = strategy
    fixup = FIXUPS.get(cls.__name__)
    if not optional and fixup is None:
        return st.fixed_dictionaries(required)
    # A few optional fields per map (a choice each for all of them made a job spec cost
    # more to draw than the master takes to refuse it).
    names = sorted(optional)

    @st.composite
    def some(draw: st.DrawFn) -> dict[str, Any]:
        data = draw(st.fixed_dictionaries(required))
        if names:
            for name in draw(st.lists(st.sampled_from(names), max_size=min(3, len(names)),
                                      unique=True)):
                data[name] = draw(optional[name])
        if fixup is not None:
            fixup(data)
        return data

    return some()


@st.composite
def mutated(draw: st.DrawFn, data: Any, most: int = 3) -> Any:
    """``data`` (a map) with up to ``most`` mutations, each somewhere in its nested maps and
    lists: a value replaced by a hostile one, a key dropped, an unknown key added."""
    data = copy.deepcopy(data)  # drawn values may share objects with others
    # Unchanged or one change most often: a map with three wrong fields is refused for the
    # first, and the code past the checks is reached by maps that pass them.
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3][:2 * most] or [0]))):
        target = data
        # Walk down a few levels into maps and lists.
        for _ in range(draw(st.integers(0, 3))):
            children = (list(target.values()) if isinstance(target, dict)
                        else target if isinstance(target, list) else [])
            nested = [c for c in children if isinstance(c, dict | list) and c]
            if not nested:
                break
            target = draw(st.sampled_from(nested))
        if isinstance(target, list):
            target[draw(st.integers(0, len(target) - 1))] = draw(hostile)
            continue
        if not isinstance(target, dict):
            continue
        op = draw(st.integers(0, 5))
        if op <= 3 and target:
            target[draw(st.sampled_from(sorted(target, key=str)))] = draw(hostile)
        elif op == 4 and target:
            target.pop(draw(st.sampled_from(sorted(target, key=str))))
        else:
            target[draw(st.one_of(st.text(max_size=12), st.sampled_from(["x", "id", "v"])))] \
                = draw(hostile)
    return data


def near_valid(cls: type, most: int = 3) -> st.SearchStrategy[dict[str, Any]]:
    """A valid map of ``cls``'s fields with up to ``most`` mutations."""
    return valid_map(cls).flatmap(lambda data: mutated(data, most))


# -- the RPC -------------------------------------------------------------------------------------

def rpc_schemas(state_dir: Path) -> dict[str, type]:
    """Each RPC method's parameter dataclass, from the method table of a real master built
    in ``state_dir`` (then closed)."""
    from masterd.api.rpc import Rpc
    from masterd.service.master import Master
    from shared.config import MasterConfig
    from shared.schema import decode

    master = Master(decode(MasterConfig, {"state_dir": str(state_dir)}, "master"))
    try:
        return {name: schema for name, (schema, _) in Rpc(master).methods.items()}
    finally:
        asyncio.run(master.close())


def valid_job(user: str = "nobody") -> dict[str, Any]:
    return {"name": "fuzz", "command": ["true"], "user": user, "kind": "cpu", "cpus": 1}


def submit_after_fuzz(client: Any, user: str, job_id: str = "after-fuzz") -> dict[str, Any]:
    """Submit a plain job once the fuzzing is over (``client``: a control.client
    MasterClient) and return its view. The fuzzed RPCs may have turned accounts on (a user in
    none is refused) or capped the user's account (over_cap): then the job goes to an
    account of its own."""
    from control.client import RpcError

    job = valid_job(user)
    try:
        return client.call("submit", {"job": job, "id": job_id})["job"]
    except RpcError as exc:
        if exc.code not in ("forbidden", "over_cap"):
            raise
    client.call("account_add", {"account": {"name": "fz-after", "users": [user]},
                                "force": True})
    return client.call("submit", {"job": {**job, "tenant": "fz-after"}, "id": job_id})["job"]


JOB_FIELDS = ["name", "command", "user", "kind", "tenant", "qos", "gpus", "gpu_model", "cpus",
              "memory_mib", "env", "workdir", "model_type", "batch", "iterations", "deadline",
              "max_nodes", "pipelined_input", "unknown_field"]


@st.composite
def mutated_job(draw: st.DrawFn, user: str = "nobody") -> dict[str, Any]:
    job = valid_job(user)
    for key in draw(st.lists(st.sampled_from(JOB_FIELDS), max_size=3)):
        if draw(st.booleans()):
            job[key] = draw(values)
        else:
            job.pop(key, None)
    return job


def rpc_params(method: str, schemas: Mapping[str, type], user: str = "nobody"
               ) -> st.SearchStrategy[Any]:
    """Parameters for ``method``: random values, or a near-valid map of its schema."""
    return _rpc_params(method, schemas.get(method), user)


@st.composite
def _rpc_params(draw: st.DrawFn, method: str, schema: type | None, user: str) -> Any:
    choice = draw(st.integers(0, 7))
    if choice == 7:
        return draw(values)
    if method == "submit" and choice >= 5:
        params: dict[str, Any] = {"job": draw(mutated_job(user))}
        if draw(st.booleans()):
            params["id"] = draw(st.one_of(st.sampled_from(JOB_IDS), st.text(max_size=70),
                                          values))
        return params
    if schema is None:
        return draw(st.dictionaries(st.text(max_size=8), values, max_size=3))
    return draw(near_valid(schema))


def rpc_methods(schemas: Mapping[str, type]) -> list[str]:
    """Every method, and names no master serves (too long, empty, unknown)."""
    return [*sorted(schemas), "x" * 70, "", "launch_missiles", "Ping"]


def rpc_bodies(schemas: Mapping[str, type], user: str = "nobody"
               ) -> st.SearchStrategy[bytes]:
    """One RPC request body (msgpack, or not); ``schemas``: each method's parameter
    dataclass (``rpc_schemas``), ``user``: the user valid jobs run as."""
    methods = rpc_methods(schemas)

    @st.composite
    def bodies(draw: st.DrawFn) -> bytes:
        # Hypothesis draws the low end of a range most often: 0 is the common case.
        kind = draw(st.integers(0, 9))
        if kind == 8:
            return draw(st.binary(max_size=200))
        if kind == 9:
            return msgpack.packb(draw(values), use_bin_type=draw(st.booleans()))
        method = draw(st.sampled_from(methods))
        envelope: dict[Any, Any] = {"v": 1, "id": draw(st.one_of(st.integers(0, 2**40),
                                                                 st.text(max_size=20))),
                                    "method": method,
                                    "params": draw(rpc_params(method, schemas, user))}
        if kind == 6:
            key = draw(st.sampled_from(["params", "id", "method", "v"]))
            envelope[key] = draw(hostile)
        body = msgpack.packb(envelope, use_bin_type=True)
        if kind == 7 and body:  # truncated or corrupted
            cut = draw(st.integers(0, len(body) - 1))
            body = body[:cut] + draw(st.binary(max_size=3))
        return body

    return bodies()


# -- the node channel ----------------------------------------------------------------------------

def inventory(name: str) -> dict[str, Any]:
    """A driver node's inventory: one GPU, two cores."""
    return encode(NodeInventory(
        name=name, hostname="fuzz", address="127.0.0.1", memory_mib=4096,
        gpus=(GpuInfo(index=0, uuid="GPU-fuzz", model="A100-SXM4-40GB", memory_mib=40960),),
        cpus=(CpuCore(id=0), CpuCore(id=1))))


# The id of the probe a driver sends after each fuzzed frame (a valid gpu_util): every answer
# before the probe's ack is the frame's. No fuzzed id equals it (they are below 2**41 or
# INT_EDGES).
PROBE_ID = 2**62 + 977
PROBE_BODY = {"index": 0, "utilization_pct": 1.0, "band": "idle"}

EVENT_TYPES = sorted(set(NODE_EVENTS) - {"hello"})
OTHER_TYPES = ["ack", "error", *sorted(STREAM_FRAMES), "prepare_job", "bogus", ""]


@st.composite
def event_body(draw: st.DrawFn, type_: str) -> Any:
    """A near-valid body of node event ``type_``, its job ids mostly from ``JOB_IDS``."""
    body = draw(valid_map(NODE_EVENTS[type_]))
    if "job_id" in body and draw(st.integers(0, 3)):
        body["job_id"] = draw(st.sampled_from(JOB_IDS))
    if "index" in body and draw(st.booleans()):
        body["index"] = draw(st.sampled_from([0, 0, 1, 1023]))
    return draw(mutated(body))


@st.composite
def node_frames(draw: st.DrawFn) -> bytes:
    """One frame on an open node session: an event (near-valid or random), a reply, a relay
    frame, a command or type no node may send, or no frame at all."""
    # Hypothesis draws the low end of a range most often: 0 is the common case.
    kind = draw(st.integers(0, 9))
    if kind == 8:
        return draw(st.binary(max_size=200))
    if kind == 9:
        return msgpack.packb(draw(values), use_bin_type=True)
    if kind == 6:
        type_ = draw(st.sampled_from(OTHER_TYPES))
        body: Any = draw(st.one_of(st.dictionaries(st.text(max_size=10), values, max_size=4),
                                   values))
    elif kind == 7:
        type_ = "hello"  # on an open session: refused as already registered
        body = {"inventory": draw(valid_map(NodeInventory))}
    else:
        type_ = draw(st.sampled_from(EVENT_TYPES))
        body = draw(event_body(type_))
    frame: dict[Any, Any] = {"v": 1, "type": type_, "id": draw(st.integers(0, 2**40)),
                             "body": body}
    if draw(st.integers(0, 7)) == 7:
        frame[draw(st.sampled_from(["body", "id", "type", "v"]))] = draw(hostile)
    return msgpack.packb(frame, use_bin_type=True)


def hellos() -> st.SearchStrategy[bytes]:
    """The first frame of a new node session: a near-valid hello (its name from
    ``HELLO_NAMES``, or mutated) or something else entirely."""
    def frame(body: Any) -> bytes:
        return encode_frame("hello", 1, body)

    return st.one_of(
        valid_map(Hello).map(frame),
        near_valid(Hello, most=1).map(frame),
        near_valid(Hello).map(frame),
        st.builds(lambda b: msgpack.packb(b, use_bin_type=True), values),
    ).filter(lambda b: NODE_PREFIX.encode() not in b)  # would replace a driver's session


def expected_replies(frame: bytes, decode: Callable[[bytes], Any]) -> int:
    """How many replies a node frame gets on an open session: none for a reply or a relayed
    stream's frame that parses (``decode``: shared.protocol.decode_frame), one otherwise."""
    try:
        parsed = decode(frame)
    except Exception:  # ProtocolError: answered on id 0
        return 1
    return 0 if parsed.type in ("ack", "error", *STREAM_FRAMES) else 1
