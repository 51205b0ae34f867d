"""/healthz and /readyz on a real master and on a node's metrics listener; the master's
readiness checks one by one."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

from demo.cluster import LocalCluster, free_port
from demo.harness import scratch_dir
from masterd.api.app import Gate, master_readiness
from shared.health import Readiness


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_master_and_node_probes() -> None:
    port = free_port()
    with scratch_dir("trellis-test-health-", mode=0o777) as root, \
            LocalCluster(root / "c", nodes=1, gpus_per_node=1, prefix="trellis-test-health",
                         extra_node={1: {"metrics_port": port}}) as cluster:
        cluster.start()
        assert get(cluster.url + "/healthz") == (200, {"status": "ok"})
        assert get(cluster.url + "/readyz") == (200, {"status": "ready", "checks": {
            "journal": "ok", "draining": "ok", "leadership": "ok"}})
        node = f"http://127.0.0.1:{port}"
        assert get(node + "/healthz") == (200, {"status": "ok"})
        assert get(node + "/readyz") == (200, {"status": "ready", "checks": {"master": "ok"}})
        assert cluster.master is not None
        cluster.master.stop(signal.SIGTERM)  # the node loses its session
        cluster.wait_for("the node to notice", lambda: get(node + "/readyz")[0] == 503,
                         timeout=30)
        code, body = get(node + "/readyz")
        assert code == 503
        assert body["status"] == "not_ready" and "no session with the master" in \
            body["checks"]["master"]
        assert get(node + "/healthz") == (200, {"status": "ok"})  # alive all the same


def test_master_readiness_checks() -> None:
    leadership = SimpleNamespace(leader=True, leader_url=None)
    master: Any = SimpleNamespace(journal=SimpleNamespace(closed=False), halted=False,
                                  leadership=leadership)
    gate = Gate()
    readiness = master_readiness(master, gate)
    assert readiness.report() == (True, {"journal": "ok", "draining": "ok",
                                         "leadership": "ok"})
    gate.closed = True
    master.journal.closed = True
    leadership.leader, leadership.leader_url = False, "http://m2:7400"
    ready, checks = readiness.report()
    assert not ready and checks == {
        "journal": "the journal is closed", "draining": "the master is shutting down",
        "leadership": "standing by; the leader is http://m2:7400"}
    master.halted = True
    assert "lost the leadership" in readiness.report()[1]["leadership"]


def test_a_check_that_raises_reports_instead_of_failing() -> None:
    readiness = Readiness()
    readiness.add("ok", lambda: None)
    readiness.add("broken", lambda: 1 / 0)  # type: ignore[arg-type, return-value]
    ready, checks = readiness.report()
    assert not ready and checks["ok"] == "ok"
    assert checks["broken"] == "check failed: ZeroDivisionError: division by zero"
