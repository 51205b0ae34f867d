"""End-to-end: a real node daemon throttles a CPU job and the master records it in the job's events.

The node runs with an emulated resctrl tree in its state directory; the test plays the memory
controller by advancing the job group's counters.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from demo.cluster import LocalCluster
from rdt import group_for_job
from rdt.emulated import advance_mbm
from tests.e2e.test_cluster import submit, wait_states


class RdtCluster(LocalCluster):
    """LocalCluster whose nodes use an emulated resctrl and a fast contention loop."""

    def _write(self, name: str, text: str) -> Path:
        if name != "master.toml":
            text += ('[rdt]\nmode = "emulated"\n'
                     "[contention]\ninterval_s = 0.2\npeak_bandwidth_mbps = 1000\n"
                     "restore_intervals = 2\n")
        return super()._write(name, text)


def test_contention_event_reaches_the_master(shared_dir: Path) -> None:
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    cluster = RdtCluster(shared_dir / prefix, nodes=1, gpus_per_node=1, prefix=prefix)
    try:
        cluster.start()
        job_id = submit(cluster, "--kind", "cpu", "--cpus", "1", "--", "sleep", "60")
        wait_states(cluster, [job_id], {"running"}, timeout=30)
        node = cluster.node_name(1)
        root = cluster.root / node / "resctrl"
        group = group_for_job(job_id)
        deadline = time.monotonic() + 20
        while not (root / group).is_dir():
            assert time.monotonic() < deadline, "the job's resctrl group never appeared\n" + \
                cluster.log(node)
            time.sleep(0.05)
        events: list[dict] = []
        while time.monotonic() < deadline:
            for domain in (0, 1):  # ~900 MiB/s over the node's 1000 MiB/s peak
                advance_mbm(root, group, domain, 45 << 20)
            time.sleep(0.1)
            reply = cluster.client().call("job", {"id": job_id})
            events = [e for e in reply["events"] if e["kind"] == "contention"]
            if events:
                break
        assert events, "no contention event recorded\n" + cluster.log(node)
        detail = events[0]["detail"]
        assert detail["action"] == "mba" and detail["value"] == 80 and detail["previous"] == 100
        assert events[0]["node"] == node and "pressure=" in detail["reason"]
        # throttled (traffic went on meanwhile, so perhaps more than one step by now)
        assert "MB:0=100;1=100" not in (root / group / "schemata").read_text()
        # The node's measured bandwidth reached the master too (the inference placer's
        # headroom), shown by `trellisctl node`: used near the peak, limit 75 % of it.
        measured = cluster.client().call("node", {"node": node}).get("memory_bandwidth")
        assert measured is not None, cluster.log(node)
        assert measured["limit_gbps"] == pytest.approx(0.75 * 1000 * (1 << 20) / 1e9, rel=1e-3)
        assert measured["used_gbps"] > 0.5 * measured["limit_gbps"]
        assert measured["headroom_gbps"] == pytest.approx(
            max(0.0, measured["limit_gbps"] - measured["used_gbps"]), abs=1e-3)
        cluster.client().call("cancel", {"id": job_id})
        wait_states(cluster, [job_id], {"cancelled", "failed", "finished"}, timeout=30)
    finally:
        cluster.close()
