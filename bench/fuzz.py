"""Fuzzing at scale: 100,000 and more hostile cases against a real master, both endpoints.

    python bench/fuzz.py [--cases 20000] [--seed N] [--workers 1] [--timeout 40] [--keep]
                         [--answers]

Starts one ``trellis-masterd`` (no nodes of its own) in a scratch directory
``trellis-test-fuzz-*`` and drives it from worker processes (``--workers`` pairs: one for
the RPC, one for the node channel; each generates its cases with Hypothesis, from the
strategies of tests/fuzzcases.py that the CI test tests/e2e/test_fuzz.py also uses):

- RPC: one persistent HTTP connection per worker; request bodies that are no msgpack, any
  msgpack, envelopes with a field replaced, and near-valid parameter maps derived from every
  method's parameter dataclass (wrong types, integers past 64 bits and on every bound, NaN,
  long strings, deep and wide junk, dropped and unknown fields).
- Node channel: one WebSocket per worker with many frames, registered as node
  ``trellis-test-fuzz-nI`` (one GPU, two cores; it refuses every command the master sends):
  every node event type of shared/messages.py NODE_EVENTS near-valid or random, replies,
  relay frames, commands and types no node sends, garbage. Each frame is followed by a probe
  (a valid ``gpu_util``), so every answer up to the probe's ack is the frame's. One case in
  ten is a new connection whose first frame is a fuzzed hello.

Per case: a *crash* is a 5xx or ``internal`` answer, a connection the master dropped although
no frame was refused for it, a traceback in the master's log (counted once per traceback) or
the master exiting (the run stops); a *hang* is no answer within ``--timeout`` seconds (40:
a ``logs`` long poll may wait 30); an *untyped* answer is neither a result nor an error with
a code and a sentence (or more or fewer node replies than frames that call for one). The
first problems are printed with their case (hex) to stderr. Everything it starts (master,
workers, scratch directory) is removed on exit, on SIGTERM and on Ctrl-C; ``--keep`` keeps
the scratch directory (the master's log).

Last line, JSON: ``cases``, ``rpc_cases``, ``node_cases``, ``crashes``, ``hangs``,
``untyped``, ``seconds``, ``seed``, and ``cases_per_s``, ``slowest_s``, ``node_closes``
(sessions closed after a frame over the size limit), ``hello_cases``. ``--answers`` prints
the answers by method and error code first (how far the cases get). On the shared 2-core
development machine one worker pair is the fastest: about 270 cases/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, scratch_dir, shielded  # noqa: E402
from tests.fuzzcases import (  # noqa: E402
    PROBE_BODY,
    PROBE_ID,
    expected_replies,
    hellos,
    inventory,
    node_frames,
    rpc_bodies,
    rpc_schemas,
    submit_after_fuzz,
)

CHUNK = 1000  # cases per Hypothesis run (a fresh engine each, seeded from the run's seed)
MAX_PROBLEMS = 20  # problems each worker reports in full
HELLO_PREFIX = b"trellis-test-fuzz-h"  # tests.fuzzcases.HELLO_NAMES


# -- checks (both workers) -----------------------------------------------------------------------

def typed_error(err: Any) -> bool:
    return (isinstance(err, dict) and isinstance(err.get("code"), str) and err["code"] != ""
            and isinstance(err.get("message"), str) and len(err["message"]) > 5)


def judge_rpc(status: int, data: bytes) -> str | None:
    """None for a good answer, else what was wrong: ``crash`` or ``untyped``."""
    try:
        reply = msgpack.unpackb(data)
    except Exception:
        return "crash" if status >= 500 else "untyped"
    if status >= 500 and not (isinstance(reply, dict) and isinstance(reply.get("error"), dict)
                              and reply["error"].get("code") in ("store_unavailable",
                                                                 "not_leader", "busy",
                                                                 "node_unreachable")):
        return "crash"
    if not isinstance(reply, dict) or reply.get("v") != 1:
        return "untyped"
    if "error" in reply:
        if not typed_error(reply["error"]):
            return "untyped"
        if reply["error"]["code"] == "internal":
            return "crash"
        return None if status >= 400 else "untyped"
    return None if status == 200 and "result" in reply else "untyped"


def judge_node(reply: dict[str, Any]) -> str | None:
    if reply.get("type") == "ack":
        return None if isinstance(reply.get("body"), dict) else "untyped"
    if reply.get("type") == "error":
        body = reply.get("body")
        if not typed_error(body):
            return "untyped"
        return "crash" if body["code"] == "internal" else None
    return "untyped"


class Tally:
    def __init__(self) -> None:
        self.counts = {"cases": 0, "crashes": 0, "hangs": 0, "untyped": 0, "node_closes": 0}
        self.slowest = 0.0
        self.slowest_case = ""
        self.problems: list[dict[str, Any]] = []
        self.answers: dict[str, int] = {}  # answers by error code ("ok": a result or ack)

    def problem(self, kind: str, case: bytes, detail: Any) -> None:
        self.counts[{"crash": "crashes", "hang": "hangs"}.get(kind, kind)] += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append({"kind": kind, "case": case[:4096].hex(),
                                  "detail": repr(detail)[:3000]})

    def answered(self, code: str) -> None:
        self.answers[code] = self.answers.get(code, 0) + 1

    def timed(self, started: float, case: bytes) -> None:
        took = time.monotonic() - started
        if took > self.slowest:
            self.slowest = took
            self.slowest_case = case[:300].hex()

    def report(self) -> dict[str, Any]:
        return {**self.counts, "slowest_s": round(self.slowest, 3), "problems": self.problems,
                "answers": self.answers, "slowest_case": self.slowest_case}


def hypothesis_runs(strategy: Any, cases: int, seed: int, each: Any, name: str,
                    tally: Tally) -> None:
    """Call ``each(case)`` for ``cases`` cases drawn from ``strategy``, in Hypothesis runs of
    ``CHUNK`` examples (generation only: nothing fails, so nothing is shrunk)."""
    done = 0
    run = 0
    while done < cases:
        count = one_run(strategy, min(CHUNK, cases - done), seed * 100_003 + run, each)
        if not count:
            raise RuntimeError("Hypothesis generated no case")
        done += count
        run += 1
        if run % 10 == 0:
            c = tally.counts
            print(f"{name}: {done} cases, crashes {c['crashes']}, hangs {c['hangs']}, "
                  f"untyped {c['untyped']}", file=sys.stderr, flush=True)


def one_run(strategy: Any, want: int, seed: int, each: Any) -> int:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    count = 0

    @with_seed(seed)
    @settings(max_examples=want, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(case: Any) -> None:
        nonlocal count
        if count < want:
            count += 1
            each(case)

    one()
    return count


# -- the RPC worker ------------------------------------------------------------------------------

class RpcDriver:
    def __init__(self, port: int, timeout: float) -> None:
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> tuple[int, bytes]:
        """The answer to ``body``; raises TimeoutError (a hang) or ConnectionError (the
        master dropped a request it had not refused)."""
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=self.timeout)
            try:
                self.conn.request("POST", "/v1/rpc", body=body,
                                  headers={"Content-Type": "application/msgpack"})
                response = self.conn.getresponse()
                data = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.close()
                return response.status, data
            except TimeoutError:
                self.close()
                raise
            except (ConnectionError, http.client.RemoteDisconnected,
                    http.client.BadStatusLine) as exc:
                # A keep-alive connection the server closed between cases: one retry.
                self.close()
                if attempt:
                    raise ConnectionError(f"the master dropped the request: {exc}") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def method_of(body: bytes) -> str:
    """The method a request body names, for the tally of answers."""
    try:
        method = msgpack.unpackb(body).get("method")
    except Exception:
        return "-"
    return method[:24] if isinstance(method, str) else "-"


def rpc_worker(args: argparse.Namespace) -> dict[str, Any]:
    schemas = rpc_schemas(Path(args.state))
    driver = RpcDriver(args.port, args.timeout)
    tally = Tally()

    def each(body: bytes) -> None:
        started = time.monotonic()
        try:
            status, data = driver.post(body)
        except TimeoutError as exc:
            tally.problem("hang", body, exc)
            return
        except ConnectionError as exc:
            tally.problem("crash", body, exc)
            return
        finally:
            tally.counts["cases"] += 1
            tally.timed(started, body)
        verdict = judge_rpc(status, data)
        with contextlib.suppress(Exception):
            reply = msgpack.unpackb(data)
            tally.answered(f"{method_of(body)}: {reply['error']['code']}" if "error" in reply
                           else f"{method_of(body)}: ok")
        if verdict is not None:
            tally.problem(verdict, body, (status, data[:400]))

    try:
        hypothesis_runs(rpc_bodies(schemas, default_job_user()), args.cases, args.seed, each,
                        f"rpc worker {args.node[-1]}", tally)
    finally:
        driver.close()
    return tally.report()


# -- the node worker -----------------------------------------------------------------------------

class NodeDriver:
    """One node session on a WebSocket; reconnects (with hello) when it is closed."""

    def __init__(self, url: str, name: str, timeout: float) -> None:
        import aiohttp

        from shared.protocol import MAX_FRAME, encode_frame

        self.aiohttp = aiohttp
        self.url = url + "/v1/node"
        self.name = name
        self.timeout = timeout
        self.max_frame = MAX_FRAME
        self.hello = encode_frame("hello", 1, {"inventory": inventory(name)})
        self.probe = encode_frame("gpu_util", PROBE_ID, PROBE_BODY)
        self.session: Any = None
        self.ws: Any = None

    async def connect(self) -> Any:
        if self.session is None:
            self.session = self.aiohttp.ClientSession()
        return await self.session.ws_connect(self.url, max_msg_size=self.max_frame,
                                             heartbeat=None, autoping=True)

    async def register(self) -> None:
        self.ws = await self.connect()
        await self.ws.send_bytes(self.hello)
        reply = await self.reply(self.ws)
        if reply is None or reply.get("type") != "ack":
            raise RuntimeError(f"node {self.name}: hello refused: {reply}")

    async def reply(self, ws: Any) -> dict[str, Any] | None:
        """The next ack or error (None: the connection closed). Commands from the master
        (it placed a fuzzed job here) are refused, like a node whose GPUs are busy."""
        from shared.protocol import encode_frame

        while True:
            msg = await ws.receive(timeout=self.timeout)
            if msg.type != self.aiohttp.WSMsgType.BINARY:
                return None
            frame = msgpack.unpackb(msg.data)
            if frame["type"] in ("ack", "error"):
                return frame
            if frame["id"]:
                await ws.send_bytes(encode_frame("error", frame["id"], {
                    "code": "gpus_busy", "message": "the fuzz node refuses every command"}))

    async def exchange(self, frame: bytes) -> list[dict[str, Any]] | None:
        """Send ``frame`` then the probe; the replies before the probe's ack (None: the
        connection closed)."""
        if self.ws is None or self.ws.closed:
            await self.register()
        try:
            await self.ws.send_bytes(frame)
            await self.ws.send_bytes(self.probe)
            replies = []
            while True:
                reply = await self.reply(self.ws)
                if reply is None:
                    return None
                if reply.get("id") == PROBE_ID:
                    if reply.get("type") != "ack":
                        replies.append(reply)  # judged: the probe must be acked
                    return replies
                replies.append(reply)
        except ConnectionError:
            return None

    async def first_frame(self, frame: bytes) -> dict[str, Any] | None:
        """A new connection whose first frame is ``frame`` (a fuzzed hello): its answer."""
        ws = await self.connect()
        try:
            await ws.send_bytes(frame)
            return await self.reply(ws)
        except ConnectionError:
            return None
        finally:
            await ws.close()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()


def node_worker(args: argparse.Namespace) -> dict[str, Any]:
    from hypothesis import strategies as st

    from shared.protocol import MAX_FRAME, decode_frame

    loop = asyncio.new_event_loop()
    driver = NodeDriver(args.url, args.node, args.timeout)
    tally = Tally()
    hello_cases = [0]
    recent: list[tuple[bytes, Any]] = []  # the last exchanges, shown with a problem

    def each(case: tuple[bool, bytes]) -> None:
        is_hello, frame = case
        started = time.monotonic()
        tally.counts["cases"] += 1
        try:
            if is_hello:
                hello_cases[0] += 1
                # Each worker's hellos name nodes of their own: a hello under a name another
                # worker's hello just registered would replace that session.
                frame = frame.replace(HELLO_PREFIX, args.hello_prefix.encode())
                reply = loop.run_until_complete(driver.first_frame(frame))
                replies = None if reply is None else [reply]
                expected = 1
            else:
                replies = loop.run_until_complete(driver.exchange(frame))
                expected = expected_replies(frame, decode_frame)
        except TimeoutError as exc:
            tally.problem("hang", frame, exc)
            loop.run_until_complete(driver.close())
            driver.session = driver.ws = None
            return
        finally:
            tally.timed(started, frame)
        if replies is None:
            # The master closes a session for a frame over the size limit (it refuses it
            # unread) or not binary (none is sent): any other close is a crash.
            tally.counts["node_closes"] += 1
            if len(frame) <= MAX_FRAME:
                tally.problem("crash", frame, "the master closed the connection")
            return
        if len(replies) != expected:
            tally.problem("untyped", frame, ("replies", expected, replies, "after",
                                             [(f.hex(), r) for f, r in recent]))
        recent.append((frame, replies))
        del recent[:-3]
        for reply in replies:
            tally.answered(f"{'hello' if is_hello else 'frame'}: "
                           f"{reply.get('body', {}).get('code', 'ok')}")
            verdict = judge_node(reply)
            if verdict is not None:
                tally.problem(verdict, frame, reply)

    frames, first_frames = node_frames(), hellos()

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[bool, bytes]:
        if draw(st.integers(0, 9)) == 0:  # one case in ten: a new connection's hello
            return True, draw(first_frames)
        return False, draw(frames)

    try:
        hypothesis_runs(cases(), args.cases, args.seed, each, f"node worker {args.node[-1]}",
                        tally)
    finally:
        loop.run_until_complete(driver.close())
        loop.close()
    return {**tally.report(), "hello_cases": hello_cases[0]}


# -- the run -------------------------------------------------------------------------------------

def tracebacks(log: Path) -> tuple[int, str]:
    text = log.read_text(errors="replace") if log.exists() else ""
    first = text.find("Traceback")
    return text.count("Traceback (most recent call last)"), (
        text[max(0, first - 1500):first + 4000] if first >= 0 else "")


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def after_the_run(cluster: LocalCluster) -> int:
    """The master still answers, and a job submitted now is there to read (0), or not (1)."""
    from control.client import RpcError

    client = cluster.client()
    try:
        client.call("ping")
        job = submit_after_fuzz(client, default_job_user())
        if client.call("job", {"id": job["id"]})["job"]["id"] != job["id"]:
            raise AssertionError(f"job {job['id']} reads back as another")
    except RpcError as exc:
        if exc.code != "internal":
            print(f"after the run: the submission was refused: {exc}", file=sys.stderr)
            return 0
        print(f"after the run: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"after the run: {exc!r}", file=sys.stderr)
        return 1
    return 0


def bench(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    workers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    with exit_on_signals(), scratch_dir("trellis-test-fuzz-", keep=args.keep) as root:
        cluster = LocalCluster(root, nodes=0, prefix="trellis-test-fuzz",
                               extra_master={"command_timeout_s": 1})
        try:
            cluster.start_master()
            # Half the cases on each endpoint, split among the workers of each kind.
            rpc_share = split(args.cases // 2 + args.cases % 2, args.workers)
            node_share = split(args.cases // 2, args.workers)
            for i in range(args.workers):
                for kind, count in (("rpc", rpc_share[i]), ("node", node_share[i])):
                    out = root / f"{kind}-{i}.json"
                    argv = [sys.executable, __file__, "--worker", kind, "--cases", str(count),
                            "--seed", str(seed + 7919 * i + (kind == "node")),
                            "--url", cluster.url, "--port", str(cluster.port),
                            "--node", f"trellis-test-fuzz-n{i}",
                            # As long as HELLO_PREFIX: the frame's msgpack stays valid.
                            "--hello-prefix", f"trellis-test-fuzz-{'hijklm'[i]}",
                            "--timeout",
                            str(args.timeout), "--state", str(root / f"schemas-{kind}-{i}"),
                            "--out", str(out)]
                    workers.append((kind, subprocess.Popen(argv, cwd=ROOT), out))
            master_exited = False
            while any(p.poll() is None for _, p, _ in workers):
                if cluster.master is None or not cluster.master.running:
                    master_exited = True
                    break
                time.sleep(0.5)
            failed = [(k, p.returncode) for k, p, _ in workers
                      if p.returncode not in (None, 0)]
            totals: dict[str, Any] = {"rpc_cases": 0, "node_cases": 0, "crashes": 0,
                                      "hangs": 0, "untyped": 0, "node_closes": 0,
                                      "slowest_s": 0.0, "hello_cases": 0}
            problems: list[dict[str, Any]] = []
            answers: dict[str, int] = {}
            slowest_case = ""
            for kind, _, out in workers:
                if not out.exists():
                    continue
                got = json.loads(out.read_text())
                totals[f"{kind}_cases"] += got["cases"]
                for key in ("crashes", "hangs", "untyped", "node_closes", "hello_cases"):
                    totals[key] += got.get(key, 0)
                if got["slowest_s"] >= totals["slowest_s"]:
                    totals["slowest_s"] = got["slowest_s"]
                    slowest_case = f"{kind}: {got['slowest_case']}"
                problems += got["problems"]
                for code, n in got.get("answers", {}).items():
                    answers[code] = answers.get(code, 0) + n
            if args.answers:
                for code, n in sorted(answers.items()):
                    print(f"{n:8d} {code}", file=sys.stderr)
                print(f"slowest answer ({totals['slowest_s']} s): {slowest_case}",
                      file=sys.stderr)
            count, excerpt = tracebacks(root / "master.log")
            totals["crashes"] += count + master_exited + len(failed)
            if master_exited:
                print("the master exited:\n" + cluster.log("master"), file=sys.stderr)
            if failed:
                print(f"workers failed: {failed}", file=sys.stderr)
            if excerpt:
                print(f"{count} traceback(s) in the master's log; the first:\n{excerpt}",
                      file=sys.stderr)
            for p in problems[:MAX_PROBLEMS]:
                print(f"{p['kind']}: {p['detail']}\n  case: {p['case'][:600]}",
                      file=sys.stderr)
            # Still alive and correct afterwards (a submission may be refused, with a
            # reason: the fuzzed RPCs may have set quotas, held or drained things).
            if not master_exited:
                totals["crashes"] += after_the_run(cluster)
        finally:
            with shielded():
                for _, proc, _ in workers:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)
                for _, proc, _ in workers:
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                cluster.close()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
    seconds = time.monotonic() - started
    cases = totals["rpc_cases"] + totals["node_cases"]
    return {"cases": cases, "rpc_cases": totals["rpc_cases"],
            "node_cases": totals["node_cases"], "crashes": totals["crashes"],
            "hangs": totals["hangs"], "untyped": totals["untyped"],
            "seconds": round(seconds, 1), "seed": seed,
            "cases_per_s": round(cases / seconds, 1), "slowest_s": totals["slowest_s"],
            "node_closes": totals["node_closes"], "hello_cases": totals["hello_cases"]}


def worker_main(args: argparse.Namespace) -> None:
    # The parent stops the workers; a Ctrl-C reaches them too, and their report is not needed
    # then.
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    import warnings

    warnings.simplefilter("ignore")  # Hypothesis' notes on large examples
    report = rpc_worker(args) if args.worker == "rpc" else node_worker(args)
    Path(args.out).write_text(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20_000,
                        help="cases in all, half on each endpoint (default 20000)")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker pairs (one RPC, one node channel each; default 1)")
    parser.add_argument("--timeout", type=float, default=40.0,
                        help="seconds without an answer that count as a hang (default 40)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--answers", action="store_true",
                        help="print how many answers each method and error code got")
    # A worker process (started by the run itself).
    parser.add_argument("--worker", choices=("rpc", "node"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--node", help=argparse.SUPPRESS)
    parser.add_argument("--hello-prefix", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.workers <= 6:
        parser.error("--workers: from 1 to 6")
    if args.worker:
        worker_main(args)
        return
    print(json.dumps(bench(args)))


if __name__ == "__main__":
    main()
