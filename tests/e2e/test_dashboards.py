"""The Grafana dashboard and the Prometheus alert rules against a real Prometheus.

A master and two nodes (with their metrics listeners) run a small workload while a private
Prometheus scrapes them every second; then every panel's query of
packaging/grafana/trellis-overview.json goes through Prometheus' HTTP API and must return data
(at least one finite value). ``promtool`` checks the rules and runs their unit tests, and the
example scrape configuration. Skipped, with the reason, where Prometheus is not installed
(``./run test`` installs Debian's ``prometheus`` package when it runs as root).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.cluster import LocalCluster, default_job_user, free_port
from demo.harness import scratch_dir

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "packaging" / "grafana" / "trellis-overview.json"
RULES = ROOT / "packaging" / "prometheus"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus; ./run test "
                             "installs it as root)")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (Debian package prometheus; ./run "
                               "test installs it as root)")
# What Grafana puts in for its interval variables; the Prometheus here is minutes old.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "15s", "$__range": "5m"}


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows' panels included."""
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            yield from walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                expr = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(variable, value)
                yield panel["title"], expr

    return list(walk(json.loads(DASHBOARD.read_text())["panels"]))


def test_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = panel_queries()
    assert dashboard["uid"] and len(queries) >= 20
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    assert not [q for _, q in queries if "$" in q], "unsubstituted Grafana variables"


@needs_promtool
def test_alert_rules_check_and_unit_tests() -> None:
    assert PROMTOOL is not None
    for args in (["check", "rules", "trellis-alerts.yml"],
                 ["test", "rules", "trellis-alerts.test.yml"],
                 ["check", "config", "--syntax-only", "prometheus.yml"]):
        proc = subprocess.run([PROMTOOL, *args], cwd=RULES, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    rules = (RULES / "trellis-alerts.yml").read_text()
    for alert in ("TrellisNodeUnreachable", "TrellisGpuUnhealthy", "TrellisOldestQueuedJob",
                  "TrellisJournalWriteErrors"):
        assert f"alert: {alert}" in rules


class Prometheus:
    def __init__(self, root: Path, targets: dict[str, list[str]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: {json.dumps(hosts)}\n"
            for job, hosts in targets.items())
        config = root / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          f"rule_files:\n  - {RULES / 'trellis-alerts.yml'}\n"
                          f"scrape_configs:\n{jobs}")
        self.log = root / "prometheus.log"
        assert PROMETHEUS is not None
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}",
                 f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    def wait_for(self, what: str, expr: str, check: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                last = self.query(expr)
                if check(last):
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}: {expr} -> {last}\n"
                             + self.log.read_text()[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def observed() -> Iterator[tuple[LocalCluster, Prometheus]]:
    with scratch_dir("trellis-test-prom-", mode=0o777) as root:
        ports = {i: free_port() for i in (1, 2)}
        with LocalCluster(root / "c", nodes=2, gpus_per_node=2, prefix="trellis-test-prom",
                          extra_node={i: {"metrics_port": p} for i, p in ports.items()}
                          ) as cluster:
            cluster.start()
            prometheus = Prometheus(root, {
                "trellis-master": [cluster.url.removeprefix("http://")],
                "trellis-node": [f"127.0.0.1:{p}" for p in ports.values()]})
            try:
                yield cluster, prometheus
            finally:
                prometheus.stop()


@needs_prometheus
def test_every_panel_returns_data(observed: tuple[LocalCluster, Prometheus]) -> None:
    cluster, prometheus = observed
    prometheus.wait_for("three targets up", "sum(up)",
                        lambda r: r and float(r[0]["value"][1]) == 3)
    client = cluster.client()
    jobs = [client.call("submit", {"job": {
        "name": f"w{i}", "command": ["sleep", "2"], "user": default_job_user(),
        "gpus": 1, "cpus": 1}})["job"]["id"] for i in range(5)]
    with pytest.raises(Exception, match="unknown_job"):
        client.call("job", {"id": "no-such-job"})  # an RPC error for the errors panel
    cluster.wait_for("the workload to end", lambda: all(
        client.call("job", {"id": j})["job"]["state"] == "finished" for j in jobs))
    # The last state scraped, and rates over at least two samples of it.
    prometheus.wait_for("the finished jobs scraped", 'sum(trellis_jobs{state="finished"})',
                        lambda r: r and float(r[0]["value"][1]) == len(jobs))
    time.sleep(2.5)
    empty = []
    for title, expr in panel_queries():
        result = prometheus.query(expr)
        values = [float(s["value"][1]) for s in result]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{title}: {expr} -> {result}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    # The scheduler's series, by name, as the dashboard reads them.
    started = prometheus.query('trellis_scheduler_schedule_attempts_total{result="scheduled"}')
    assert float(started[0]["value"][1]) >= len(jobs)
    pending = prometheus.query("trellis_scheduler_pending_jobs")
    assert {(s["metric"]["queue"], s["metric"]["array"]) for s in pending} == {
        (q, a) for q in ("active", "requeued") for a in ("cpu", "small", "large")}
