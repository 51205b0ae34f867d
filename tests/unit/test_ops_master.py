"""The master process in-process: SIGHUP reload, SIGTERM drain, metrics, events/node RPCs."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from masterd.api.app import GATE_KEY, RPC_KEY
from masterd.api.rpc import NoParams
from masterd.core.policy import Preempt, Start
from masterd.journal.store import Store, StoreError
from masterd.main import MasterDaemon
from shared.config import MasterConfig, load_config
from shared.model import Placement
from shared.protocol import encode_rpc_request
from tests.unit.helpers import (
    inventory,
    job,
    wait_for_async,
    writer_log_level,
    writer_sleep,
)

JOB = {"name": "t", "command": ["true"], "user": "nobody", "gpus": 1, "cpus": 1}


def write_config(path: Path, state: Path, **extra: Any) -> None:
    lines = ["[master]", 'listen_host = "127.0.0.1"', "listen_port = 0",
             f'state_dir = "{state}"']
    for key, value in extra.items():
        lines.append(f"{key} = {value}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(autouse=True)
def keep_root_level() -> Iterator[None]:
    """Reloads change the root logger's level; give it back."""
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[MasterDaemon]:
    cfg = tmp_path / "master.toml"
    write_config(cfg, tmp_path / "state")
    d = MasterDaemon(load_config(MasterConfig, cfg, "master"), str(cfg))
    await d.start()
    assert d.master is not None
    # Registered but without a session, as after a master restart: nothing is placed there.
    d.master.core.node_up(inventory("n1", gpus=4, cpus=8))
    d.master.core.node_down("n1")
    yield d
    if d.runner is not None and not d.runner.app[GATE_KEY].closed:
        await d.close()


def url(d: MasterDaemon) -> str:
    assert d.runner is not None
    host, port = d.runner.addresses[0][:2]
    return f"http://{host}:{port}"


async def rpc(d: MasterDaemon, method: str, params: dict[str, Any] | None = None
              ) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(
            url(d) + "/v1/rpc", data=encode_rpc_request(method, params or {})) as r:
        return r.status, msgpack.unpackb(await r.read())


async def scrape(d: MasterDaemon) -> dict[str, list[Any]]:
    async with aiohttp.ClientSession() as s, s.get(url(d) + "/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, []).extend(family.samples)
    return out


def value(samples: list[Any], name: str, **labels: str) -> float:
    hits = [s.value for s in samples if s.name == name
            and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, samples)
    return hits[0]


# -- reload ----------------------------------------------------------------------------------

async def test_reload_applies_run_time_keys_and_logs_each(daemon: MasterDaemon, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    assert daemon.master is not None
    write_config(tmp_path / "master.toml", tmp_path / "state", stop_grace_s=3.5,
                 node_grace_s=7, allowed_users='["nobody"]', log_level='"debug"')
    with caplog.at_level(logging.INFO, "trellis.master"):
        assert daemon.reload()
    cfg = daemon.master.config
    assert (cfg.stop_grace_s, cfg.node_grace_s, cfg.allowed_users) == (3.5, 7.0, ("nobody",))
    assert logging.getLogger().level == logging.DEBUG
    # The journal writer, a process of its own, follows.
    journal = daemon.master.journal

    async def writer_at_debug() -> bool:
        return await journal.call(writer_log_level) == logging.DEBUG

    await wait_for_async(writer_at_debug, timeout=5,
                         what="the journal writer to take the new log level")
    text = caplog.text
    assert "config_reload key=stop_grace_s change=10.0→3.5" in text
    assert "config_reload key=allowed_users change=()→('nobody',)" in text
    # The new allowed list is enforced at once.
    status, reply = await rpc(daemon, "submit", {"job": dict(JOB, user="daemon")})
    assert status == 400 and reply["error"]["code"] == "user_refused"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[master]\nstop_grace_s = -1\n", "master.stop_grace_s: must be at least 0"),
        ("[master]\nbogus = 1\n", "unknown field(s) 'bogus'"),
        ("[master\n", "not valid TOML"),
        ("[mastr]\n", "unknown section(s) mastr"),
    ],
)
async def test_reload_refuses_bad_config_and_keeps_the_old(
        daemon: MasterDaemon, tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str,
        reason: str) -> None:
    assert daemon.master is not None
    before = daemon.master.config
    (tmp_path / "master.toml").write_text(text)
    with caplog.at_level(logging.INFO, "trellis.master"):
        assert not daemon.reload()
    assert daemon.master.config is before
    assert "config_reload refused" in caplog.text and reason in caplog.text
    assert (await rpc(daemon, "ping"))[0] == 200


async def test_reload_does_not_apply_keys_that_need_a_restart(
        daemon: MasterDaemon, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert daemon.master is not None
    write_config(tmp_path / "master.toml", tmp_path / "state", policy='"drf"', stop_grace_s=2)
    with caplog.at_level(logging.INFO, "trellis.master"):
        assert daemon.reload()
    assert daemon.master.config.policy == "fifo" and daemon.master.config.stop_grace_s == 2
    assert "config_reload key=policy change='fifo'→'drf' not applied: needs a restart" \
        in caplog.text


async def test_reload_keeps_command_line_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "m.toml"
    write_config(cfg, tmp_path / "state", log_level='"info"')
    overrides = {"log_level": "warning", "listen_port": None}
    d = MasterDaemon(load_config(MasterConfig, cfg, "master", **overrides), str(cfg), overrides)
    write_config(cfg, tmp_path / "state", log_level='"debug"', stop_grace_s=1)
    assert d.reload()
    assert d.config.log_level == "warning" and d.config.stop_grace_s == 1


# -- drain -----------------------------------------------------------------------------------

async def test_drain_refuses_new_requests_and_finishes_those_in_flight(
        daemon: MasterDaemon) -> None:
    assert daemon.runner is not None
    release = asyncio.Event()
    entered = asyncio.Event()

    async def slow(_: NoParams) -> dict[str, Any]:
        entered.set()
        await release.wait()
        return {"slow": True}

    daemon.runner.app[RPC_KEY].methods["ping"] = (NoParams, slow)
    in_flight = asyncio.ensure_future(rpc(daemon, "ping"))
    await entered.wait()
    closing = asyncio.ensure_future(daemon.close())
    gate = daemon.runner.app[GATE_KEY]
    await wait_for_async(lambda: gate.closed, what="the drain to close the gate")
    status, reply = await rpc(daemon, "nodes")
    assert status == 503 and reply["error"]["code"] == "shutting_down"
    assert "shutting down" in reply["error"]["message"]
    async with aiohttp.ClientSession() as s, s.get(url(daemon) + "/healthz") as r:
        assert r.status == 503
    assert not closing.done()  # still waiting for the request in flight
    release.set()
    status, reply = await in_flight
    assert status == 200 and reply["result"] == {"slow": True}
    await asyncio.wait_for(closing, 10)


async def test_drain_lets_a_submission_reach_the_disk(daemon: MasterDaemon,
                                                      tmp_path: Path) -> None:
    master = daemon.master
    assert master is not None
    # Occupy the journal writer so the submission's commit is still pending when SIGTERM comes.
    blocker = asyncio.ensure_future(master.journal.call(writer_sleep, 1.0))
    submit = asyncio.ensure_future(rpc(daemon, "submit", {"job": JOB, "id": "late-1"}))
    # The job id is reserved in memory just before its journal write is issued; other
    # features' own journal writes may be in flight too, so the count alone proves nothing.
    await wait_for_async(
        lambda: not blocker.done() and "late-1" in master.core.jobs
        and master.journal.in_flight >= 2,
        what="the submission to be queued in the journal behind the busy writer")
    await daemon.close()
    status, reply = await submit
    await blocker
    assert status == 200 and reply["result"]["job"]["id"] == "late-1"
    store = Store(tmp_path / "state" / "master.db")
    try:
        assert [j.id for j in store.load_jobs()] == ["late-1"]
    finally:
        store.close()


async def test_a_killed_journal_writer_costs_only_what_was_in_flight(daemon: MasterDaemon,
                                                                   tmp_path: Path) -> None:
    """The writer process dies (OOM killer, operator): the submission it was writing is
    refused with store_unavailable, never acknowledged; the next one starts a new writer."""
    master = daemon.master
    assert master is not None
    status, reply = await rpc(daemon, "submit", {"job": JOB, "id": "first"})
    assert status == 200 and "result" in reply
    writer = master.journal._writer
    assert writer is not None
    busy = tmp_path / "writer-busy"
    blocker = asyncio.ensure_future(master.journal.call(writer_sleep, 5, str(busy)))
    in_flight = asyncio.ensure_future(rpc(daemon, "submit", {"job": JOB, "id": "lost"}))
    # Killed while it is inside the blocking call, with the submission issued behind it.
    await wait_for_async(lambda: busy.exists() and master.journal.in_flight >= 2,
                         what="the writer to be busy with the submission queued behind it")
    os.kill(writer.proc.pid, signal.SIGKILL)
    status, reply = await in_flight
    assert reply["error"]["code"] == "store_unavailable", reply
    with pytest.raises(StoreError):
        await blocker
    status, reply = await rpc(daemon, "submit", {"job": JOB, "id": "second"})
    assert status == 200 and reply["result"]["job"]["id"] == "second"
    assert master.journal.writer_restarts == 1
    status, reply = await rpc(daemon, "jobs", {})
    assert sorted(j["id"] for j in reply["result"]["jobs"]) == ["first", "second"]
    store = Store(tmp_path / "state" / "master.db")
    try:
        assert sorted(j.id for j in store.load_jobs()) == ["first", "second"]
    finally:
        store.close()


# -- RPCs ------------------------------------------------------------------------------------

async def test_events_rpc_after_tail_and_job(daemon: MasterDaemon) -> None:
    for i in range(5):
        assert (await rpc(daemon, "submit", {"job": JOB, "id": f"e{i}"}))[0] == 200
    _, reply = await rpc(daemon, "events", {})
    rows = reply["result"]["events"]
    assert [r["job"] for r in rows if r["kind"] == "submitted"] == [f"e{i}" for i in range(5)]
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs) and reply["result"]["last"] == seqs[-1]
    _, reply = await rpc(daemon, "events", {"after": seqs[1], "limit": 2})
    assert [r["seq"] for r in reply["result"]["events"]] == seqs[2:4]
    _, reply = await rpc(daemon, "events", {"tail": 2})
    assert [r["seq"] for r in reply["result"]["events"]] == seqs[-2:]
    _, reply = await rpc(daemon, "events", {"job": "e3", "tail": 10})
    assert {r["job"] for r in reply["result"]["events"]} == {"e3"}
    _, reply = await rpc(daemon, "events", {"after": seqs[-1]})
    assert reply["result"] == {"events": [], "last": seqs[-1]}
    status, reply = await rpc(daemon, "events", {"after": -1})
    assert status == 400 and "params.after: must be at least 0" in reply["error"]["message"]
    status, reply = await rpc(daemon, "events", {"job": "../x"})
    assert status == 400 and reply["error"]["code"] == "invalid_params"


async def test_node_rpc(daemon: MasterDaemon) -> None:
    status, reply = await rpc(daemon, "node", {"node": "n1"})
    assert status == 200
    result = reply["result"]
    assert result["node"]["name"] == "n1" and result["jobs"] == []
    assert [g["index"] for g in result["node"]["gpu_detail"]] == [0, 1, 2, 3]
    assert all(g["job"] is None for g in result["node"]["gpu_detail"])
    assert result["rdt"] == {"cat": False, "mba": False, "mbm": False, "mba_mbps": False}
    status, reply = await rpc(daemon, "node", {"node": "nope"})
    assert status == 404 and reply["error"]["code"] == "unknown_node"


# -- metrics ---------------------------------------------------------------------------------

async def test_metrics_follow_the_master(daemon: MasterDaemon) -> None:
    master = daemon.master
    assert master is not None
    m = await scrape(daemon)
    assert value(m["trellis_queue_length"], "trellis_queue_length") == 0
    assert value(m["trellis_queue_head_wait_seconds"], "trellis_queue_head_wait_seconds") == 0
    # n1 was registered without a session: disconnected, one-hot.
    statuses = {s.labels["status"]: s.value for s in m["trellis_node_status"]}
    assert statuses == {"ready": 0, "drained": 0, "maintenance": 0, "reserved": 0,
                        "disconnected": 1, "unreachable": 0, "down": 0, "powering_down": 0,
                        "powered_down": 0, "powering_up": 0}
    assert {s.labels["state"]: s.value for s in m["trellis_reservations"]} == {
        "planned": 0, "active": 0}
    assert value(m["trellis_node_gpus"], "trellis_node_gpus", node="n1") == 4

    # Queue two jobs: with n1 not schedulable (no session) they wait.
    for i in range(2):
        assert (await rpc(daemon, "submit", {"job": JOB, "id": f"q{i}"}))[0] == 200
    await rpc(daemon, "launch_missiles")
    await rpc(daemon, "launch_missiles_again")
    # Each submission asked for a scheduling pass, run soon after it rather than within it.
    await wait_for_async(lambda: master.passes >= 2, what="the submissions' scheduling passes")
    m = await scrape(daemon)
    assert value(m["trellis_jobs"], "trellis_jobs", state="queued", kind="training") == 2
    assert value(m["trellis_jobs"], "trellis_jobs", state="running", kind="training") == 0
    assert value(m["trellis_queue_length"], "trellis_queue_length") == 2
    # Two submissions, at least one commit each way they were batched; none waiting now.
    assert value(m["trellis_journal_transactions"], "trellis_journal_transactions_total") >= 1
    assert value(m["trellis_journal_in_flight"], "trellis_journal_in_flight") == 0
    assert value(m["trellis_journal_writer_restarts"],
                 "trellis_journal_writer_restarts_total") == 0
    assert value(m["trellis_queue_head_wait_seconds"], "trellis_queue_head_wait_seconds") > 0
    assert value(m["trellis_rpc_duration_seconds"], "trellis_rpc_duration_seconds_count",
                 method="submit") == 2
    # Unknown method names share one label value: a client cannot grow the series.
    assert value(m["trellis_rpc_duration_seconds"], "trellis_rpc_duration_seconds_count",
                 method="unknown") == 2
    assert value(m["trellis_rpc_errors"], "trellis_rpc_errors_total", method="unknown",
                 code="unknown_method") == 2
    passes = value(m["trellis_scheduling_pass_duration_seconds"],
                   "trellis_scheduling_pass_duration_seconds_count")
    assert passes >= 2 and passes == master.passes
    assert value(m["trellis_master_build_info"], "trellis_master_build_info",
                 policy="fifo") == 1

    # Decisions are counted as the pass reports them.
    j = job("p1")
    placement = Placement(())
    master.observe_pass(0.001, [Preempt(job_id="x", reason="test"),  # type: ignore[attr-defined]
                                Start(job_id=j.id, placement=placement)])
    m = await scrape(daemon)
    assert value(m["trellis_preemptions"], "trellis_preemptions_total") == 1
    assert value(m["trellis_placements"], "trellis_placements_total") == 1

