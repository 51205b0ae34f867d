"""Write the protocol reference (docs/protocol.md) from the code that serves the protocol.

    python -m masterd.api.protocol_doc            # writes docs/protocol.md
    python -m masterd.api.protocol_doc --check    # exit 1 if docs/protocol.md is stale

Everything comes from the code: the RPC methods are the live method table of a master built
in a scratch directory (the features' methods included), each method's parameters its schema
dataclass (types, bounds, defaults, and the comment above or beside each field), its result
and own error codes the ``@returns`` mark next to its handler (shared.rpcdoc), the error
codes every ``JobError``/``ProtocolError`` raised in masterd/ and shared/, the job view what
``job_view`` returns for a sample job, and the node channel the schemas of shared.messages.
tests/unit/test_protocol_doc.py fails when the checked-in file differs.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import enum
import inspect
import re
import sys
import tempfile
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import masterd
import shared
from masterd.api.app import STATUS_OF
from masterd.api.rpc import Rpc, job_view
from masterd.service.master import Master
from shared import protocol
from shared.config import MasterConfig
from shared.messages import NODE_COMMAND_REPLIES, NODE_COMMANDS, NODE_EVENT_REPLIES, NODE_EVENTS
from shared.model import Job, JobSpec, WaitReason
from shared.relay import MAX_CHUNK as MAX_RELAY_CHUNK
from shared.relay import ClientOpen
from shared.schema import Bounds, decode
from shared.views import JobView, PlacementPart

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "docs" / "protocol.md"
COMMAND = "python -m masterd.api.protocol_doc"

# What the codes any method may answer with mean (the ones not tied to one method).
GENERAL_ERRORS = {
    "bad_request": "the body is not an RPC request (not a map, no method, a bad id)",
    "bad_frame": "the body is not valid msgpack",
    "bad_version": "the request's `v` is not this protocol version",
    "frame_too_large": "the body exceeds the frame limit",
    "too_deep": "the body is nested too deeply",
    "unknown_method": "no such method (the message lists the known ones)",
    "invalid_params": "a parameter is missing, of the wrong type, out of bounds or unknown "
                      "(the message names it: `params.job.gpus: must be at least 0, got -1`)",
    "unauthenticated": "no valid credentials (a token or a client certificate) where the "
                       "master requires them",
    "forbidden": "the caller's role may not call this method, or not with these parameters",
    "shutting_down": "the master is draining on SIGTERM: retry once it is back",
    "store_unavailable": "the journal could not record the request (disk full, read-only); "
                         "nothing was done",
    "not_leader": "this master is a standby (high availability); `detail.leader` names the "
                  "leader",
    "internal": "a bug: the master logged it; nothing is known to have been done",
    "stale_epoch": "node channel: the sender leads at an older master epoch than the node "
                   "has seen (a node refusing a command, a master refusing a node's hello)",
}


# -- types ------------------------------------------------------------------------------------


def type_text(tp: Any, links: Mapping[type, str]) -> str:
    """A type hint as a reader of the wire sees it."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        text = " or ".join(type_text(a, links) for a in options)
        return text + (" or nil" if type(None) in get_args(tp) else "")
    if tp is Any:
        return "any"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return f"[{tp.__name__}](#{links[tp]})" if tp in links else "map"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in tp)
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return "list of " + ", ".join(type_text(a, links) for a in args)
        return "list of " + (type_text(args[0], links) if args else "any")
    if origin in (dict, Mapping) or tp is dict:
        args = get_args(tp) or (Any, Any)
        return f"map of {type_text(args[0], links)} to {type_text(args[1], links)}"
    return {str: "string", int: "integer", float: "number", bool: "boolean",
            bytes: "bytes"}.get(tp, getattr(tp, "__name__", str(tp)))


def limits_text(bounds: Bounds | None, tp: Any) -> str:
    if bounds is None:
        return ""
    parts = []
    if bounds.min is not None:
        parts.append(f"≥ {bounds.min:g}")
    if bounds.max is not None:
        parts.append(f"≤ {bounds.max:g}")
    if bounds.max_len is not None:
        listed = get_origin(tp) in (list, tuple) or any(
            get_origin(a) in (list, tuple) for a in get_args(tp))
        parts.append(f"at most {bounds.max_len:,} {'items' if listed else 'characters'}")
    if bounds.pattern is not None:
        parts.append(f"matches `{bounds.pattern}`")
    return "; ".join(parts)


def default_text(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{}"
    if dataclasses.is_dataclass(value):  # a nested table left out: each field its default
        return "{} (every field its default)"
    if isinstance(value, str):
        return f'"{value}"'
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def field_comments(cls: type) -> dict[str, str]:
    """The comment lines right above each field in the class body, or beside it."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"\s+([a-z_][a-z0-9_]*)\s*:", line)
        if match:
            text = " ".join(pending)
            if "  # " in line:
                text = (text + " " + line.split("  # ", 1)[1].strip()).strip()
            if text:
                comments[match.group(1)] = text
        pending = []
    return comments


def fields_table(cls: type, links: Mapping[type, str]) -> list[str]:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    if not fields:
        return ["No parameters.", ""]
    hints = get_type_hints(cls)
    notes = field_comments(cls)
    rows = ["| field | type | limits | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in fields:
        tp = hints[f.name]
        rows.append("| `{}` | {} | {} | {} | {} |".format(
            f.name, type_text(tp, links), limits_text(f.metadata.get("bounds"), tp) or "",
            default_text(f), prose(notes.get(f.name, "")).replace("|", "\\|")))
    return [*rows, ""]


# -- errors -----------------------------------------------------------------------------------


_CODE_CALL = re.compile(r"^(JobError|ProtocolError|BatchRefused)$")


def raised_codes(source: str) -> set[str]:
    """Codes of ``JobError("code", ...)`` and ``ProtocolError("code", ...)`` in ``source``."""
    codes: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and _CODE_CALL.match(node.func.id) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            codes.add(node.args[0].value)
    return codes


def all_codes() -> dict[str, list[str]]:
    """Every error code raised in masterd/ and shared/, with the modules raising it (the
    document lists the codes; the modules help a reader of the code)."""
    where: dict[str, set[str]] = {}
    for package in (masterd, shared):
        base = Path(package.__file__).resolve().parent
        for path in sorted(base.rglob("*.py")):
            module = ".".join(path.relative_to(base.parent).with_suffix("").parts)
            for code in raised_codes(path.read_text()):
                where.setdefault(code, set()).add(module)
    return {code: sorted(modules) for code, modules in sorted(where.items())}


def handler_codes(handler: Callable[..., Any]) -> set[str]:
    fn = getattr(handler, "__func__", handler)
    try:
        return raised_codes(inspect.getsource(fn))
    except (OSError, TypeError):
        return set()


# -- the document ---------------------------------------------------------------------------


def method_table() -> dict[str, tuple[type, Callable[..., Any]]]:
    """The RPC method table of a real master (built in a scratch directory, then closed)."""
    with tempfile.TemporaryDirectory(prefix="trellis-protocol-doc-") as state:
        config = decode(MasterConfig, {"state_dir": state}, "master")
        master = Master(config)
        try:
            return dict(Rpc(master).methods)
        finally:
            asyncio.run(master.close())


def prose(text: str) -> str:
    """A docstring as one Markdown paragraph (reST ``literals`` become `code`)."""
    return re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split()))


def anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def schemas_of(cls: type) -> Iterator[type]:
    """``cls`` and the dataclasses its fields name, depth first."""
    seen: set[type] = set()

    def walk(tp: Any) -> Iterator[type]:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if tp in seen:
                return
            seen.add(tp)
            yield tp
            for hint in get_type_hints(tp).values():
                yield from walk(hint)
        for arg in get_args(tp):
            yield from walk(arg)

    yield from walk(cls)


def sample_job_view() -> dict[str, Any]:
    spec = JobSpec(name="train", command=("python3", "train.py"), user="alice", gpus=1)
    return job_view(Job(id="train-1", spec=spec, submit_time=1_700_000_000.0))


def render() -> str:
    methods = method_table()
    links: dict[type, str] = {JobSpec: "job-spec"}
    out = [
        "# Trellis protocol reference",
        "",
        f"<!-- Generated by `{COMMAND}` from the code; do not edit by hand. "
        "tests/unit/test_protocol_doc.py checks it is current. -->",
        "",
        "Clients (`trellisctl`, inference services, scripts) call the master over msgpack RPC; "
        "node daemons speak to it over a WebSocket. The Python client is documented in "
        "[sdk.md](sdk.md).",
        "",
        "## Envelope",
        "",
        f"- Protocol version `{protocol.PROTOCOL_VERSION}` travels in every message as `v`; "
        "another version is refused with `bad_version`.",
        f"- Every frame and request body is at most {protocol.MAX_FRAME:,} bytes, nested at "
        f"most {protocol.MAX_NESTING} levels deep.",
        "- RPC: `POST /v1/rpc` with a msgpack map `{\"v\": 1, \"id\": ID, \"method\": NAME, "
        "\"params\": {...}}` (`Content-Type: application/msgpack`). `id` is an integer or a "
        f"string of at most {protocol.MAX_ID} characters, echoed in the reply; `method` at "
        f"most {protocol.MAX_METHOD} characters.",
        "- Reply: `{\"v\": 1, \"id\": ID, \"result\": ...}`, or `{\"v\": 1, \"id\": ID, "
        "\"error\": {\"code\": CODE, \"message\": SENTENCE, \"detail\"?: {...}}}` with an HTTP "
        "status from the code (below). `message` names what was wrong; `detail`, when "
        "present, is machine-readable.",
        "- Credentials: `Authorization: Bearer TOKEN` or a TLS client certificate, as the "
        "master is configured (docs/security.md). `GET /healthz`, `GET /readyz` need none; "
        "`GET /metrics` is Prometheus text.",
        "- Names that can reach a path (job ids, tenants, node names) match "
        "`[A-Za-z0-9][A-Za-z0-9_-]{0,62}`.",
        "",
        "## Methods",
        "",
        "| method | what it does |",
        "| --- | --- |",
    ]
    for name, (_, handler) in sorted(methods.items()):
        summary = prose((inspect.getdoc(handler) or "").split("\n\n")[0])
        out.append(f"| [`{name}`](#{anchor(name)}) | {summary.replace('|', '/')} |")
    out.append("")
    extra: list[type] = []
    answered_by: dict[str, list[str]] = {}  # error code -> the methods that list it
    for name, (schema, handler) in sorted(methods.items()):
        doc = inspect.getdoc(handler) or ""
        out += [f"### {name}", ""]
        if doc:
            out += [prose(doc), ""]
        out += ["Parameters:", ""]
        out += fields_table(schema, links)
        for cls in list(schemas_of(schema))[1:]:
            if cls not in links:
                links[cls] = anchor(cls.__name__)
                extra.append(cls)
        result = getattr(handler, "rpc_result", None)
        out += [f"Result: {result}" if result else "Result: **not documented** (add "
                "`@returns(...)` from shared.rpcdoc to the handler).", ""]
        own = sorted(set(getattr(handler, "rpc_errors", ())) | handler_codes(handler))
        for code in own:
            answered_by.setdefault(code, []).append(name)
        if own:
            out += ["Errors: " + ", ".join(f"`{c}`" for c in own) + " (and the general "
                    "ones).", ""]
    out += ["## Job spec", "",
            "What `submit` takes as `job` (and `submit_many` as each of `jobs`): "
            "`shared.model.JobSpec`. Besides each field's own limits: a `cpu` job asks for no "
            "GPUs, a `training` job for at least one, every job for a GPU or a core; `env` "
            "keys are non-empty and contain no `=`.", ""]
    out += fields_table(JobSpec, links)
    for cls in extra:
        out += [f"### {cls.__name__}", ""]
        if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
            out += [prose(inspect.getdoc(cls) or ""), ""]
        out += fields_table(cls, links)
    out += ["## Job view", "",
            "How `submit`, `submit_many`, `cancel`, `jobs` and `job` show a job: "
            "`shared.views.JobView`, which the typed SDK returns (docs/sdk.md); the master's "
            "`masterd.api.rpc.job_view` gives exactly these keys.", ""]
    out += fields_table(JobView, links)
    out += ["### PlacementPart", ""]
    out += fields_table(PlacementPart, links)
    out += ["An example, a queued job:", "", "| key | value |", "| --- | --- |"]
    out += [f"| `{k}` | `{v!r}` |" for k, v in sample_job_view().items()]
    out += why_a_job_waits()
    out += ["", "## Error codes", "",
            "Every error code raised in the master's code (`masterd/`, `shared/`), its HTTP "
            "status, and the methods that list it. Any method may answer with the general "
            "ones.", "",
            "| code | HTTP | meaning | methods |", "| --- | --- | --- | --- |"]
    for code in sorted(set(all_codes()) | set(GENERAL_ERRORS) | set(STATUS_OF) | set(answered_by)):
        status = STATUS_OF.get(code, 500 if code == "internal" else 400)
        methods_listing = ", ".join(f"`{m}`" for m in answered_by.get(code, [])) or "-"
        out.append(f"| `{code}` | {status} | {GENERAL_ERRORS.get(code, '')} | "
                   f"{methods_listing} |")
    out += ["", "## Node channel", "",
            "`GET /v1/node` upgraded to a WebSocket; binary msgpack frames `{\"v\": 1, "
            "\"type\": T, \"id\": N, \"body\": {...}}`, each answered by a frame of type "
            "`ack` or `error` (`body`: `{code, message}`) with the same id. The node opens "
            "the connection and says `hello` first.", "", "### Node to master", ""]
    for kind, schema in sorted(NODE_EVENTS.items()):
        out += [f"#### {kind}", ""]
        out += fields_table(schema, links)
        if kind in NODE_EVENT_REPLIES:
            out += ["Answered with an `ack` whose body is:", ""]
            out += fields_table(NODE_EVENT_REPLIES[kind], links)
    out += ["### Master to node", ""]
    for kind, schema in sorted(NODE_COMMANDS.items()):
        out += [f"#### {kind}", ""]
        out += fields_table(schema, links)
        if kind in NODE_COMMAND_REPLIES:
            out += ["Answered with an `ack` whose body is:", ""]
            out += fields_table(NODE_COMMAND_REPLIES[kind], links)
    out += relayed_streams(links)
    return "\n".join(out).rstrip() + "\n"


def relayed_streams(links: dict[type, str]) -> list[str]:
    """The stream frames both WebSockets carry and the client's relay endpoint
    (shared/relay.py, docs/interactive.md)."""
    out = ["### Relayed streams", "",
           "A job's terminal and its forwarded TCP connections ([interactive jobs]"
           "(interactive.md#relayed-streams)). After `relay_open`, both directions of the "
           "node channel carry frames of id 0 that are not answered: `relay_data` "
           f"`{{stream, data}}` (at most {MAX_RELAY_CHUNK} bytes), `relay_ack` "
           "`{stream, bytes}` (that many bytes were passed on: the sender may send as many "
           "more; at most `window` unacknowledged), `relay_resize` `{stream, rows, cols}` "
           "(master to node, terminals) and `relay_close` `{stream, reason}`.", "",
           "## Relay endpoint", "",
           "`GET /v1/relay` upgraded to a WebSocket, authenticated as `/v1/rpc` (a client "
           "credential reaches its own user's jobs, an admin every job). The client's first "
           "frame (node-channel framing, id 0) is `relay_open`; the master answers "
           "`relay_opened` `{stream, node, window}` or `error` `{code, message}` (codes "
           "`unknown_job`, `forbidden`, `not_running`, `no_terminal`, `busy`, "
           "`not_listening`, `connect_failed`, `node_unreachable`, `invalid_params`) and "
           "closes. Then the stream frames above, `stream` being the one `relay_opened` "
           "named.", "", "#### relay_open (client)", ""]
    out += fields_table(ClientOpen, links)
    return out


def member_comments(cls: type[enum.Enum]) -> dict[str, str]:
    """The comment beside each member of an enum (``NAME = "value"  # comment``)."""
    comments: dict[str, str] = {}
    for line in inspect.getsource(cls).splitlines():
        match = re.match(r"\s+([A-Z_]+)\s*=\s*\"[^\"]*\"\s*#\s*(.*)", line)
        if match:
            comments[match.group(1)] = match.group(2).strip()
    return comments


def why_a_job_waits() -> list[str]:
    """The wait-reason vocabulary (shared.model.WaitReason) and how a reason is chosen
    (masterd.core.waiting)."""
    notes = member_comments(WaitReason)
    out = ["", "## Why a job waits", "",
           "A queued job's view carries `wait`, one code of this vocabulary shared by every "
           "policy, and `reason`, a sentence. `jobs` and `job` compute them when asked "
           "(`masterd.core.waiting`); the first that applies wins: a closed admission gate "
           "(`held`, `dependency`, `time_limit`, `quota`, `reservation`: the job is kept from "
           "the policy "
           "altogether), the policy's own note from its last pass (`policy`), the head job's "
           "reservation (`reserved`), no placement fitting the free resources now (`no_fit`), "
           "a reservation holding what it fits (`reserved`), else `priority`. Jobs that are not "
           "queued have `wait` = `\"\"`.", "",
           "| wait | meaning | example reason |", "| --- | --- | --- |"]
    examples = {
        WaitReason.HELD: "held by its user (trellisctl release train-4 lets it go)",
        WaitReason.DEPENDENCY: "waits for afterok:prep-3 (running)",
        WaitReason.TIME_LIMIT: "its time limit exceeds the master's maximum",
        WaitReason.QUOTA: "its tenant is at its cap",
        WaitReason.RESERVATION: "waits for its reservation course, which begins at "
                                "2026-12-03 14:00",
        WaitReason.NO_FIT: "no node has 4 free GPUs of A100 now",
        WaitReason.PRIORITY: "behind 12 jobs the policy orders first",
        WaitReason.RESERVED: "resources reserved from 14:05 on gpu-3",
        WaitReason.POLICY: "waiting: large:A100 reclaims it from b3",
    }
    for reason in WaitReason:
        out.append(f"| `{reason.value}` | {prose(notes.get(reason.name, ''))} | "
                   f"{examples.get(reason, '')} |")
    out += ["", "A job whose dependency can never be satisfied is not left waiting: it ends "
            "`cancelled` with the reason naming the term (`dependency afterok:prep-3 can "
            "never be satisfied: prep-3 failed`). Journal events (`events`) record each step: "
            "`dependency` (`after`, `status` = `waiting`, `satisfied` or `never`, `reason`), "
            "`held` and `released` (`by` = `user` or `admin`, `who`), `updated` (each changed "
            "field as `[old, new]`, `by`, `who`)."]
    return out


def undocumented(methods: Mapping[str, tuple[type, Callable[..., Any]]]) -> list[str]:
    return sorted(n for n, (_, h) in methods.items() if not getattr(h, "rpc_result", None))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description="Write docs/protocol.md from code.")
    p.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    p.add_argument("--output", type=Path, default=OUTPUT)
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
