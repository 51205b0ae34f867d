"""Scrape /metrics of a real master and a real node daemon while a job runs; parse both."""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from demo.cluster import Daemon, LocalCluster, default_job_user, free_port

USER = default_job_user()


def scrape(url: str) -> dict[str, list[Any]]:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("trellis_"), family.name
        out.setdefault(family.name, []).extend(family.samples)
    return out


def sample(m: dict[str, list[Any]], family: str, name: str | None = None,
           **labels: str) -> float:
    hits = [s.value for s in m.get(family, []) if s.name == (name or family)
            and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (family, labels, m.get(family))
    return hits[0]


def start_node_with_metrics(cluster: LocalCluster, port: int) -> str:
    """Like LocalCluster.start_node, with the metrics listener switched on."""
    name = cluster.node_name(1)
    cfg = cluster.root / f"{name}.toml"
    cfg.write_text(
        "[node]\n"
        f'name = "{name}"\nmaster_url = "{cluster.url}"\nstate_dir = "{cluster.root / name}"\n'
        f'cgroup_parent = "{name}"\nsample_interval_s = 0.2\nreconnect_max_s = 1.0\n'
        f"metrics_port = {port}\n"
        '[gpu]\nbackend = "emulated"\ncount = 2\nmemory_mib = 4096\nbusy_util = 90.0\n')
    daemon = Daemon(name, [sys.executable, "-m", "noded.main", "-c", str(cfg)],
                    cluster.root / f"{name}.log")
    daemon.start(cluster._env())
    cluster.node_daemons[name] = daemon
    return name


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_master_and_node_metrics(shared_dir: Path) -> None:
    prefix = f"trellis-test-m{time.time_ns() % 10**6}"
    cluster = LocalCluster(shared_dir / "c", nodes=0, prefix=prefix)
    port = free_port()
    try:
        cluster.start_master()
        node = start_node_with_metrics(cluster, port)
        cluster.wait_nodes(1)
        client = cluster.client()
        job = client.call("submit", {"job": {"name": "m", "command": ["sleep", "300"],
                                             "user": USER, "gpus": 1, "cpus": 1}})["job"]["id"]
        queued = client.call("submit", {"job": {"name": "q", "command": ["true"], "user": USER,
                                                "gpus": 2, "cpus": 1}})["job"]["id"]
        eventually(lambda: client.call("job", {"id": job})["job"]["state"] == "running")

        master = scrape(cluster.url + "/metrics")
        assert sample(master, "trellis_jobs", state="running", kind="training") == 1
        assert sample(master, "trellis_jobs", state="queued", kind="training") == 1
        assert sample(master, "trellis_jobs", state="finished", kind="cpu") == 0
        assert sample(master, "trellis_queue_length") == 1
        assert sample(master, "trellis_queue_head_wait_seconds") > 0
        assert sample(master, "trellis_node_status", node=node, status="ready") == 1
        assert sample(master, "trellis_node_status", node=node, status="unreachable") == 0
        assert sample(master, "trellis_nodes_connected") == 1
        assert sample(master, "trellis_node_gpus_allocated", node=node) == 1
        assert sample(master, "trellis_rpc_duration_seconds",
                      "trellis_rpc_duration_seconds_count", method="submit") == 2
        assert sample(master, "trellis_scheduling_pass_duration_seconds",
                      "trellis_scheduling_pass_duration_seconds_count") >= 1
        assert sample(master, "trellis_preemptions", "trellis_preemptions_total") == 0
        assert sample(master, "trellis_placements", "trellis_placements_total") == 1

        gpu = client.call("job", {"id": job})["job"]["placement"][0]["gpus"][0]

        def node_sees_job() -> bool:
            m = scrape(f"http://127.0.0.1:{port}/metrics")
            return any(s.labels.get("job") == job and s.value > 0
                       for s in m.get("trellis_gpu_utilization_ratio", []))

        eventually(node_sees_job)
        m = scrape(f"http://127.0.0.1:{port}/metrics")
        util = {s.labels["gpu"]: s for s in m["trellis_gpu_utilization_ratio"]}
        assert set(util) == {"0", "1"}
        held = util[str(gpu)]
        assert held.labels["job"] == job and held.labels["node"] == node
        assert held.labels["uuid"].startswith("GPU-") and held.value == 0.9
        other = util[str(1 - gpu)]
        assert other.labels["job"] == "" and other.value == 0
        assert sample(m, "trellis_gpu_memory_total_bytes", gpu=str(gpu)) == 4096 * 2**20
        assert sample(m, "trellis_gpu_memory_used_bytes", gpu=str(gpu), job=job) > 0
        assert sample(m, "trellis_gpu_healthy", gpu=str(gpu)) == 1
        assert sample(m, "trellis_job_cpu_cores", node=node, job=job) == 1
        assert sample(m, "trellis_job_gpus", node=node, job=job) == 1
        assert sample(m, "trellis_jobs_running", node=node) == 1
        assert sample(m, "trellis_node_connected", node=node) == 1
        client.call("cancel", {"id": queued})
    finally:
        cluster.close()
