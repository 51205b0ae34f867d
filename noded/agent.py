"""The node agent: one WebSocket to the master, commands in, events out.

The node always dials the master (no inbound port on GPU servers) and redials with capped
exponential backoff plus jitter. Each (re)connection starts with ``hello`` carrying the
inventory and every job part this node knows about, which is how the master reconciles.

With several masters (``master_url = "http://a:7400,http://b:7400"``, one leading, see
docs/high-availability.md) the node dials them in turn: a standby answers ``not_leader``
naming the leader and the node dials that one next (only if it is one of its configured
URLs: its token goes nowhere else).

A leader can also go silent: frozen (SIGSTOP, a hung host: its kernel still accepts TCP
connections and answers nothing) or cut off (its packets dropped). So every dial is bounded
(``connect_timeout_s`` for TCP, TLS and the WebSocket handshake), a session whose pings go
unanswered for half of ``heartbeat_s`` is a failure of that master, not a normal close, and,
with several masters, the node then learns who leads before dialling again: it asks every
master's ``/readyz`` at once (200 only on the leader; a standby answers 503 at once, a silent
master not at all) and dials the first that leads. A node so reaches a new leader within a
poll of its takeover, whatever state the old one is in. See docs/high-availability.md.

Every frame from a master that acked our hello (data, ping or pong: the session answers
pings itself, so it sees them) renews the node lease (noded/selffence.py): a node that
hears from no master for too long stops the parts the master would requeue elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from noded.fencing import EpochFence
from noded.gpu.base import GpuBackend, GpuHealthEvent, GpuSample
from noded.joblogs import LogReader
from noded.jobs import FORK_WAIT_S, JobPart, JobRefused, JobRunner
from noded.relays import NodeRelays
from noded.selffence import SelfFence
from shared.messages import (
    NODE_COMMANDS,
    ForgetJob,
    GpuHealth,
    GpuUtil,
    Hello,
    HelloAck,
    JobExited,
    JobStarted,
    ListParts,
    PartList,
    PrepareJob,
    ReadLog,
    RelayOpen,
    ResetGpu,
    SignalJob,
    StalePart,
    StartJob,
    StopJob,
    utilisation_band,
)
from shared.model import NodeInventory
from shared.protocol import MAX_FRAME, ProtocolError, decode_frame, encode_frame, error_body
from shared.relay import STREAM_FRAMES
from shared.schema import SchemaError, decode, encode

log = logging.getLogger("trellis.node.agent")


class StaleMaster(Exception):
    """The master dialled leads at an older epoch than this node has seen (it refused our
    hello with ``stale_epoch``): a newer master leads elsewhere."""


class NotLeader(Exception):
    """The master dialled is a standby; ``leader`` is the URL it named (or None)."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader or 'none yet'})")
        self.leader = leader


class MasterSilent(Exception):
    """The master dialled accepted the connection (or had a session) but stopped answering."""


# Frames that show the master is there (not an error or a close made here, such as a heartbeat
# that got no pong): each renews the node lease.
_FROM_THE_MASTER = frozenset({aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.PING,
                              aiohttp.WSMsgType.PONG})

# While masters answer but none leads yet (a takeover under way), each is asked again this
# often (with jitter): a node reaches the new leader within about this of its takeover.
LEADER_POLL_S = 0.5
# How long a node asks for the leader before it dials the next master in turn all the same
# (at least; reconnect_max_s if longer): longer than a takeover (the lease, 15 s by default).
LEADER_SEARCH_S = 30.0


def master_urls(master_url: str) -> list[str]:
    """The masters' base URLs from ``master_url`` (one, or several comma-separated)."""
    urls = [u.strip().rstrip("/") for u in master_url.split(",") if u.strip()]
    return list(dict.fromkeys(urls)) or ["http://127.0.0.1:7400"]


class NodeAgent:
    def __init__(
        self,
        master_url: str,
        inventory: Callable[[], NodeInventory],
        runner: JobRunner,
        gpus: GpuBackend,
        sample_interval_s: float = 1.0,
        reconnect_max_s: float = 30.0,
        headers: dict[str, str] | None = None,
        ssl_context: Any = None,
        heartbeat_only_s: float = 0.0,
        logs: LogReader | None = None,
        fence: EpochFence | None = None,
        connect_timeout_s: float = 5.0,
        heartbeat_s: float = 5.0,
        lease: SelfFence | None = None,
    ) -> None:
        self.masters = master_urls(master_url)
        self._current = 0
        self._headers = headers or {}  # the bearer token: never logged
        self._ssl = ssl_context if ssl_context is not None else True
        self.inventory = inventory
        self.runner = runner
        self.gpus = gpus
        self.sample_interval_s = sample_interval_s
        self.reconnect_max_s = reconnect_max_s
        # A dial (TCP, TLS, WebSocket handshake) that takes longer fails; a master that does
        # not answer a ping within half of heartbeat_s is silent (node.master_* settings).
        self.connect_timeout_s = connect_timeout_s
        self.heartbeat_s = heartbeat_s
        # Masters that went silent on this node and have not been joined since: a standby
        # naming one (its lease has not run out yet) is not followed there.
        self._silent: set[int] = set()
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._bands: dict[int, str] = {}
        self._unhealthy: dict[int, str] = {}
        self.connected = asyncio.Event()
        # Set once the first dial has connected or failed (the daemon is then "ready").
        self.dialled = asyncio.Event()
        self.last_error = ""
        self.last_samples: list[GpuSample] = []  # the latest GPU sample, for /metrics
        # Benchmarks and tests only (node.heartbeat_only_s): events wait for the next beat,
        # as on a node that reports by heartbeat instead of at once (Liquid §6.3's baseline).
        self.heartbeat_only_s = heartbeat_only_s
        self._held: list[tuple[str, dict[str, Any]]] = []
        runner.on_exited = self._job_exited
        runner.on_stale = self._stale_part
        # The newest master epoch seen (noded/fencing.py); noded's is kept in its state
        # directory, a test's without one in memory.
        self.fence = fence if fence is not None else EpochFence(None)
        self._hello_id = -1  # the id of this connection's hello, whose ack names the epoch
        # The master's clock minus this node's, from the last hello ack (None: not known).
        self._clock_offset: float | None = None
        # The node lease (noded/selffence.py), renewed by every frame of a session whose
        # hello was acked; None (a test's agent): the node never stops a part on its own.
        self.lease = lease
        self._acked = False
        # Jobs' output (read_log; made on the first read if not given); its reads run beside
        # the receive loop (they may wait).
        self.logs = logs
        self._reads: set[asyncio.Task[None]] = set()
        # Jobs' terminals and ports, relayed through the master (noded/relays.py).
        self.relays = NodeRelays(runner, lambda type_, body: self._put(type_, body, 0))
        # (job, reason): tell a job why it is preempted, before its warning (the metrics
        # channel's $TRELLIS_PREEMPTED_FILE; None: no channel, only the signal).
        self.preempted_note: Callable[[str, str], None] | None = None

    @property
    def url(self) -> str:
        """The node endpoint of the master dialled now."""
        return self.masters[self._current] + "/v1/node"

    def _next_master(self, leader: str | None = None) -> bool:
        """Dial the named leader next if it is one of ours, else the next master; True when
        a whole round of masters has been tried (time to back off)."""
        if leader is not None and self._follow(leader):
            return False
        self._current = (self._current + 1) % len(self.masters)
        return self._current == 0

    # -- connection ----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        monitor = asyncio.get_running_loop().create_task(self._monitor_gpus(stop))
        beats = (asyncio.get_running_loop().create_task(self._heartbeats(stop))
                 if self.heartbeat_only_s > 0 else None)
        leasing = (asyncio.get_running_loop().create_task(self.lease.run(stop))
                   if self.lease is not None else None)
        delay = 0.2
        try:
            async with aiohttp.ClientSession() as http:
                while not stop.is_set():
                    leader: str | None = None
                    try:
                        await self._session(http, stop)
                        delay = 0.2
                    except NotLeader as exc:
                        log.info("master url=%s is a standby; leader=%s", self.url,
                                 exc.leader or "none yet")
                        self.last_error = f"master is a standby ({exc})"
                        leader = exc.leader or ""
                    except StaleMaster as exc:
                        log.error("master url=%s refused: %s", self.url, exc)
                        self.last_error = f"master leads at an older epoch ({exc})"
                    except MasterSilent as exc:
                        log.warning("master silent url=%s: %s", self.url, exc)
                        self.last_error = f"master silent: {exc}"
                        self._silent.add(self._current)
                    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                        log.warning("master unreachable url=%s error=%r", self.url, str(exc))
                        self.last_error = f"master unreachable: {exc}"
                    except ProtocolError as exc:
                        log.error("master refused us reason=%r", exc.message)
                        self.last_error = f"master refused us: {exc.message}"
                    self.dialled.set()
                    self.connected.clear()
                    self.ws = None
                    if stop.is_set():
                        break
                    if len(self.masters) > 1:
                        if leader is not None and self._follow(leader):
                            await asyncio.sleep(0.05)  # straight to the leader just named
                            continue
                        left = self._current
                        found = await self._find_leader(
                            http, stop, max(LEADER_SEARCH_S, self.reconnect_max_s))
                        if found is None:
                            # Nobody said it leads (or /readyz is not reachable): the next
                            # master in turn; its answer (not_leader naming one) is the news.
                            self._next_master()
                            continue
                        self._current = found
                        if found != left:
                            continue  # another master leads now: go at once
                    # The same master again: full jitter keeps a fleet of nodes from
                    # redialling in lockstep.
                    wait = random.uniform(0, delay)
                    delay = min(self.reconnect_max_s, delay * 2)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            if leasing is not None:
                leasing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await leasing
            if beats is not None:
                beats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beats

    def _follow(self, leader: str) -> bool:
        """Dial the leader a standby named next, if it is one of ours, not the master dialled
        now (one that names itself is still opening its journal: no redirect) and not one
        that went silent on us (the standby names it until its lease runs out)."""
        named = leader.rstrip("/")
        if named not in self.masters:
            return False
        i = self.masters.index(named)
        if i == self._current or i in self._silent:
            # A silent one is only dialled again once its /readyz says it leads.
            return False
        self._current = i
        return True

    async def _find_leader(self, http: aiohttp.ClientSession, stop: asyncio.Event,
                           limit_s: float) -> int | None:
        """The index of a master whose ``/readyz`` says it leads, asking every master at once
        and each again until one does; None after ``limit_s`` or once ``stop`` is set.

        A master that answers (a standby, 503) is asked again every LEADER_POLL_S; one that
        does not (refused, or silent past connect_timeout_s) after a pause that doubles up
        to reconnect_max_s. /readyz needs no credentials, so the token is not sent.
        """
        started = asyncio.get_running_loop().time()

        async def watch(i: int) -> int:
            pause = LEADER_POLL_S
            while True:
                answer = await self._probe(http, i)
                if answer is True:
                    return i
                pause = LEADER_POLL_S if answer is False else min(self.reconnect_max_s,
                                                                  pause * 2)
                await asyncio.sleep(random.uniform(pause / 2, pause))

        watchers = [asyncio.ensure_future(watch(i)) for i in range(len(self.masters))]
        stopper = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({*watchers, stopper}, timeout=limit_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*watchers, stopper):
                task.cancel()
            await asyncio.gather(*watchers, stopper, return_exceptions=True)
        for task in watchers:
            if task in done and not task.cancelled() and task.exception() is None:
                found = task.result()
                log.info("leader found url=%s after %.1f s", self.masters[found],
                         asyncio.get_running_loop().time() - started)
                return found
        return None

    async def _probe(self, http: aiohttp.ClientSession, i: int) -> bool | None:
        """Whether master ``i`` leads (its /readyz is 200), None when it does not answer
        within connect_timeout_s."""
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                async with http.get(self.masters[i] + "/readyz", ssl=self._ssl,
                                    allow_redirects=False) as r:
                    return r.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("master url=%s: no answer to /readyz (%r)", self.masters[i], str(exc))
            return None

    async def _session(self, http: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        try:
            # aiohttp's own limit is its session's (300 s): a frozen master's kernel accepts
            # the connection and the handshake would wait that long.
            async with asyncio.timeout(self.connect_timeout_s):
                # autoping off: _receive answers pings itself, so that every frame of the
                # master, a pong included, renews the node lease.
                ws = await http.ws_connect(
                    self.url, max_msg_size=MAX_FRAME, heartbeat=self.heartbeat_s,
                    headers=self._headers, ssl=self._ssl, autoping=False,
                    timeout=aiohttp.ClientWSTimeout(ws_close=self.connect_timeout_s))
        except TimeoutError:
            raise MasterSilent(f"no WebSocket handshake within {self.connect_timeout_s:g} s "
                               "(node.master_connect_timeout_s)") from None
        try:
            self.ws = ws
            self._acked = False  # frames renew the lease once this master took our hello
            hello = Hello(inventory=self.inventory(), jobs=tuple(self.runner.reports()),
                          epoch=self.fence.epoch)
            self._hello_id = next(self._ids) * 2 + 1
            await self._put("hello", encode(hello), self._hello_id)
            log.info("connected url=%s jobs_reported=%d", self.url, len(hello.jobs))
            self._silent.discard(self._current)
            self.last_error = ""
            self.connected.set()
            self.dialled.set()
            await self._receive(ws, stop)
        finally:
            self.relays.close_all("the node's session with the master ended")
            await ws.close()

    async def _receive(self, ws: aiohttp.ClientWebSocketResponse, stop: asyncio.Event) -> None:
        """Dispatch the master's frames until it closes the session (a normal return), stops
        answering pings (MasterSilent) or ``stop`` is set."""
        stopper = asyncio.get_running_loop().create_task(stop.wait())
        try:
            while True:
                receive = asyncio.ensure_future(ws.receive())
                done, _ = await asyncio.wait({receive, stopper},
                                             return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    receive.cancel()
                    return
                msg = receive.result()
                if (self._acked and self.lease is not None
                        and msg.type in _FROM_THE_MASTER):
                    self.lease.heard()
                if msg.type == aiohttp.WSMsgType.BINARY:
                    await self._dispatch(msg.data)
                    continue
                if msg.type == aiohttp.WSMsgType.PING:
                    await ws.pong(msg.data)
                    continue
                if msg.type == aiohttp.WSMsgType.PONG:
                    continue
                if isinstance(ws.exception(), aiohttp.ServerTimeoutError):
                    # aiohttp's heartbeat: no pong within heartbeat_s / 2.
                    raise MasterSilent(f"no answer to a ping within {self.heartbeat_s / 2:g} s "
                                       "(node.master_heartbeat_s / 2)")
                log.warning("connection to master closed (%s)", msg.type.name)
                return
        finally:
            stopper.cancel()

    async def send_event(self, type_: str, body: dict[str, Any]) -> None:
        """Send a node → master event from another part of noded; dropped while disconnected."""
        await self._send(type_, body)

    async def _send(self, type_: str, body: dict[str, Any], id_: int | None = None) -> None:
        if self.heartbeat_only_s > 0 and id_ is None and type_ != "hello":
            self._held.append((type_, body))
            return
        await self._put(type_, body, id_)

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        """Send the events held since the last beat, every ``heartbeat_only_s``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.heartbeat_only_s)
            held, self._held = self._held, []
            for type_, body in held:
                await self._put(type_, body)

    async def _put(self, type_: str, body: dict[str, Any], id_: int | None = None) -> None:
        ws = self.ws
        if ws is None or ws.closed:
            return  # hello on the next connection carries what matters
        if id_ is None:
            id_ = next(self._ids) * 2 + 1  # odd ids: node-initiated
        try:
            await ws.send_bytes(encode_frame(type_, id_, body))
        except (ConnectionError, RuntimeError) as exc:
            log.debug("send %s failed: %s", type_, exc)

    # -- commands ------------------------------------------------------------------------
    async def _dispatch(self, data: bytes) -> None:
        try:
            frame = decode_frame(data)
        except ProtocolError as exc:
            log.warning("bad frame from master: %s", exc.message)
            return
        if frame.type in ("ack", "error"):
            if frame.type == "error":
                if frame.body.get("code") == "not_leader":
                    detail = frame.body.get("detail") or {}
                    leader = detail.get("leader") if isinstance(detail, dict) else None
                    raise NotLeader(leader if isinstance(leader, str) else None)
                if frame.id == self._hello_id and frame.body.get("code") == "stale_epoch":
                    raise StaleMaster(str(frame.body.get("message", "")))
                log.warning("master rejected message %d: %s", frame.id, frame.body)
            elif frame.id == self._hello_id:
                self._hello_acked(frame.body)
            return
        if frame.type in STREAM_FRAMES:  # a relayed stream's bytes: no ack (shared/relay.py)
            self.relays.frame(frame.type, frame.body)
            return
        schema = NODE_COMMANDS.get(frame.type)
        try:
            if schema is None:
                raise ProtocolError("unknown_type", f"unknown command {frame.type!r}")
            try:
                cmd = decode(schema, frame.body)
            except SchemaError as exc:
                raise ProtocolError("invalid_message", f"{frame.type}: {exc}") from None
            # Every command acts on a job: none from an older master than one seen.
            self.fence.admit(cmd.epoch, frame.type)
            if isinstance(cmd, ReadLog):
                # A read may wait for output (a long poll): it must not hold up the commands
                # behind it, so it answers from a task of its own.
                task = asyncio.get_running_loop().create_task(self._read_log(cmd, frame.id))
                self._reads.add(task)
                task.add_done_callback(self._reads.discard)
                return
            if isinstance(cmd, RelayOpen):
                # Connecting may take a moment: beside the receive loop, as a read.
                task = asyncio.get_running_loop().create_task(self._open_relay(cmd, frame.id))
                self._reads.add(task)
                task.add_done_callback(self._reads.discard)
                return
            result = await self._execute(cmd)
        except (ProtocolError, JobRefused) as exc:
            code = exc.code
            message = exc.message
            log.warning("command %s refused: %s", frame.type, message)
            await self._send("error", error_body(code, message), frame.id)
            return
        except Exception as exc:  # never let one command take the daemon down
            log.exception("command %s failed", frame.type)
            await self._send("error", error_body("internal", str(exc)), frame.id)
            return
        await self._send("ack", result, frame.id)

    async def _execute(self, cmd: Any) -> dict[str, Any]:
        if isinstance(cmd, PrepareJob):
            return self.runner.prepare(cmd)
        if isinstance(cmd, StartJob):
            self._check_deadline(cmd)
            result = self.runner.start(cmd)
            # Started: its process exists (an image job's container runs). Waited for at
            # most until shortly before the master stops waiting for the answer.
            await self.runner.until_forked(cmd.job_id, self._time_left(cmd, FORK_WAIT_S))
            asyncio.get_running_loop().call_soon(
                lambda: asyncio.ensure_future(self._job_started(cmd.job_id, result["pid"],
                                                                cmd.restarts)))
            return result
        if isinstance(cmd, StopJob):
            note = self.preempted_note
            before = (None if not cmd.preempted or note is None
                      else lambda: note(cmd.job_id, cmd.reason))
            self.runner.stop(cmd.job_id, cmd.grace_s, cmd.reason, cmd.restarts, cmd.warning,
                             before)
            return {}
        if isinstance(cmd, ForgetJob):
            self.runner.forget(cmd.job_id, cmd.restarts)
            return {}
        if isinstance(cmd, SignalJob):
            return {"delivered": self.runner.send_signal(cmd.job_id, cmd.signal,
                                                         cmd.leader_only, cmd.restarts)}
        if isinstance(cmd, ResetGpu):
            return {"recovered": await self._reset_gpu(cmd.index)}
        if isinstance(cmd, ListParts):
            return encode(PartList(jobs=tuple(self.runner.reports())))
        raise ProtocolError("unknown_type", f"unhandled command {type(cmd).__name__}")

    async def _read_log(self, cmd: ReadLog, id_: int) -> None:
        if self.logs is None:
            self.logs = LogReader(self.runner)
        try:
            chunk = await self.logs.read(cmd)
        except JobRefused as exc:
            await self._send("error", error_body(exc.code, exc.message), id_)
            return
        except OSError as exc:
            log.warning("job=%s log not readable: %s", cmd.job_id, exc)
            await self._send("error", error_body(
                "log_unreadable", f"node cannot read the output of job {cmd.job_id}: "
                f"{exc.strerror or exc}"), id_)
            return
        except Exception as exc:  # never let one read take the daemon down
            log.exception("read_log of job %s failed", cmd.job_id)
            await self._send("error", error_body("internal", str(exc)), id_)
            return
        await self._send("ack", encode(chunk), id_)

    async def _open_relay(self, cmd: RelayOpen, id_: int) -> None:
        try:
            result = await self.relays.open(cmd)
        except JobRefused as exc:
            await self._send("error", error_body(exc.code, exc.message), id_)
            return
        except Exception as exc:  # never let one stream take the daemon down
            log.exception("relay_open of job %s failed", cmd.job_id)
            await self._send("error", error_body("internal", str(exc)), id_)
            return
        await self._send("ack", result, id_)

    def _time_left(self, cmd: StartJob, most: float) -> float:
        """Seconds until shortly before ``cmd.expires_at`` (at most ``most``, at least a
        moment): how long a start may be held before its answer would come too late."""
        if cmd.expires_at is None or self._clock_offset is None:
            return most
        left = cmd.expires_at - (time.time() + self._clock_offset) - 0.25
        return max(0.05, min(most, left))

    def _check_deadline(self, cmd: StartJob) -> None:
        """Refuse a start the master has given up on (StartJob.expires_at), judged in the
        master's time: this node's clock plus the offset its last hello ack measured."""
        if cmd.expires_at is None or self._clock_offset is None:
            return
        late = time.time() + self._clock_offset - cmd.expires_at
        if late > 0:
            raise JobRefused("expired", f"start_job of {cmd.job_id} came {late:.1f} s after "
                             "the master stopped waiting for it; not started")

    def _hello_acked(self, body: dict[str, Any]) -> None:
        """The master took our hello; its ack names the epoch it leads at and the lease."""
        try:
            ack = decode(HelloAck, body, "ack")
        except SchemaError as exc:
            # Not a master's answer we can trust: the lease is not renewed by this session.
            log.error("master's hello ack not understood: %s", exc)
            return
        try:
            self.fence.learn(ack.epoch)
        except JobRefused as exc:  # commands carry the epoch too: each tries again
            log.error("%s", exc.message)
        self._acked = True
        if ack.time is not None:
            # The master's clock minus ours, as of the ack (off by at most the time the ack
            # took to arrive): how a command's deadline in the master's time reads here.
            self._clock_offset = ack.time - time.time()
        if self.lease is not None:
            self.lease.learn(ack.lease)

    # -- events --------------------------------------------------------------------------
    async def _job_started(self, job_id: str, pid: int, restarts: int = 0) -> None:
        await self._send("job_started", encode(JobStarted(job_id=job_id, pid=pid,
                                                          restarts=restarts)))

    async def _job_exited(self, part: JobPart) -> None:
        # Kept on disk until the master says forget_job, so an exit is never lost.
        await self._send("job_exited", encode(JobExited(
            job_id=part.job_id, exit_code=part.exit_code, signal=part.signal,
            reason=part.reason[:512], restarts=part.restarts, fenced=bool(part.fenced))))

    def _stale_part(self, stale: StalePart) -> None:
        asyncio.get_running_loop().create_task(self._send("stale_part", encode(stale)))

    async def _monitor_gpus(self, stop: asyncio.Event) -> None:
        """Sample GPUs; push utilisation band changes and health changes as events."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                samples = await loop.run_in_executor(None, self.gpus.sample)
                health = await loop.run_in_executor(None, self.gpus.poll_health, 0)
            except Exception:
                log.exception("GPU sampling failed")
                samples, health = [], []
            self.last_samples = samples
            for event in health:
                await self._health(event)
            holders = self._gpu_holders()
            for sample in samples:
                if not sample.healthy and sample.index not in self._unhealthy:
                    await self._health(GpuHealthEvent(sample.index, "", False,
                                                      sample.error or "unhealthy"))
                band = utilisation_band(sample.utilization_pct)
                if self._bands.get(sample.index) != band:
                    self._bands[sample.index] = band
                    await self._send("gpu_util", encode(GpuUtil(
                        index=sample.index, utilization_pct=min(100.0, sample.utilization_pct),
                        band=band, job_id=holders.get(sample.index))))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.sample_interval_s)

    async def _health(self, event: GpuHealthEvent) -> None:
        if event.healthy:
            self._unhealthy.pop(event.index, None)
        else:
            self._unhealthy[event.index] = event.reason
        log.log(logging.INFO if event.healthy else logging.WARNING,
                "gpu=%d healthy=%s reason=%s", event.index, event.healthy, event.reason)
        await self._send("gpu_health", encode(GpuHealth(
            index=event.index, healthy=event.healthy, reason=event.reason[:512],
            xid=None if event.healthy else event.xid)))

    async def _reset_gpu(self, index: int) -> bool:
        """An operator returns GPU ``index`` to service (trellisctl gpu reset): the backend
        forgets its fault, and the health event that follows says so to the master."""
        held = index in self._unhealthy
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.gpus.recover, index)
        except ValueError as exc:  # no such GPU here
            raise ProtocolError("unknown_gpu", str(exc)) from None
        log.warning("gpu=%d returned to service by an operator (held out: %s)", index, held)
        return held

    def _gpu_holders(self) -> dict[int, str]:
        return {
            g: p.job_id
            for p in self.runner.parts.values() if p.state == "running"
            for g in p.prepare.allocation.gpus
        }

    def unhealthy_gpus(self) -> dict[int, str]:
        return dict(self._unhealthy)
