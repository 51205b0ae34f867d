"""Fair share, accounting and what-if replays against real daemons.

One cluster for the module (a real master with fair share ordering on and a node with two
emulated GPUs): jobs of two accounts run for real; the factor orders the queue (the account
that used less starts first); ``trellisctl share`` and ``trellisctl report`` (table, JSON,
CSV) show it; the account label reaches /metrics; after a kill -9 of the master the usage
rebuilt from the journal is the same; ``trellis-sim whatif`` replays that very journal.
"""

from __future__ import annotations

import csv
import io
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.cluster import LocalCluster, default_job_user
from demo.harness import scratch_dir
from tests.e2e.cli import ROOT, ctl

USER = default_job_user()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with scratch_dir("trellis-test-fairshare-", mode=0o777) as root, LocalCluster(
            root / "c", prefix="trellis-test-fs", nodes=1, gpus_per_node=2,
            extra_master={"fairshare": {"order": True, "recalc_s": 0}}) as c:
        c.start()
        (root / "gate").mkdir(mode=0o777)
        c.gate = root / "gate" / "go"  # type: ignore[attr-defined]
        yield c


def submit(cluster: LocalCluster, name: str, tenant: str, gpus: int, script: str) -> str:
    code, out, err = ctl(cluster, "submit", "--name", name, "--tenant", tenant, "--gpus",
                         str(gpus), "--user", USER, "--", "sh", "-c", script)
    assert code == 0, err
    return out["job"]["id"]


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return cluster.client().call("job", {"id": job_id})["job"]


def ended(cluster: LocalCluster, *ids: str) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        jobs = [job(cluster, i) for i in ids]
        return jobs if all(j["state"] in ("finished", "failed") for j in jobs) else None

    return cluster.wait_for(f"jobs {ids} to end", check)


def share(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    code, out, err = ctl(cluster, "share")
    assert code == 0, err
    return {row["account"]: row for row in out["accounts"]}


def test_the_account_that_used_less_starts_first(cluster: LocalCluster) -> None:
    warm = submit(cluster, "warm", "heavy", 2, "sleep 2")
    ended(cluster, warm)
    gate = cluster.gate  # type: ignore[attr-defined]
    blocker = submit(cluster, "blocker", "heavy", 2,
                     f"while [ ! -e {gate} ]; do sleep 0.1; done; sleep 1")
    cluster.wait_for("the blocker to run", lambda: job(cluster, blocker)["state"] == "running")
    # Both wait behind the blocker until the gate opens; FIFO alone would start heavy's first.
    first = submit(cluster, "heavy-next", "heavy", 2, "sleep 1")
    second = submit(cluster, "light-next", "light", 2, "sleep 1")
    failing = submit(cluster, "light-fails", "light", 1, "exit 3")
    assert job(cluster, first)["state"] == job(cluster, second)["state"] == "queued"
    gate.touch()
    heavy, light, failed = ended(cluster, first, second, failing)
    assert light["start_time"] < heavy["start_time"], (light, heavy)
    assert failed["state"] == "failed"
    rows = share(cluster)
    assert rows["heavy"]["raw_usage"] > rows["light"]["raw_usage"] > 0
    assert rows["heavy"]["factor"] < rows["light"]["factor"] <= 1.0
    assert rows["heavy"]["norm_shares"] == pytest.approx(0.5)
    code, text, err = ctl(cluster, "share", json_out=False)
    assert code == 0 and "FAIRSHARE" in text and "heavy" in text, err
    code, text, err = ctl(cluster, "-o", "csv", "share", json_out=False)
    assert code == 0, err
    table = {r["account"]: r for r in csv.DictReader(io.StringIO(text))}
    assert float(table["heavy"]["factor"]) == pytest.approx(rows["heavy"]["factor"], rel=1e-2)


def test_report_through_trellisctl(cluster: LocalCluster) -> None:
    # Each ended job got its accounting row through the journal writer (the report's fast
    # path reads them).
    db = sqlite3.connect(f"file:{cluster.root / 'master' / 'master.db'}?mode=ro", uri=True)
    try:
        rows = cluster.wait_for("the accounting rows", lambda: db.execute(
            "SELECT COUNT(*) FROM accounting").fetchone()[0] == 5)
    finally:
        db.close()
    assert rows
    code, out, err = ctl(cluster, "report", "--by", "account", "--since", "1h")
    assert code == 0, err
    rows = {r["account"]: r for r in out["rows"]}
    heavy, light = rows["heavy"], rows["light"]
    assert heavy["jobs"]["finished"] == 3 and light["jobs"]["failed"] == 1
    # Three runs of 2 GPUs for at least 2, 1 and 1 s (plus start-up and the gate's wait).
    assert 2 * 3.9 / 3600 < heavy["gpu_hours_allocated"] < 2 * 60 / 3600
    assert heavy["gpu_hours_allocated"] > light["gpu_hours_allocated"] > 0
    assert heavy["started"] == 3 and heavy["wait_p95_s"] >= heavy["wait_p50_s"] >= 0
    assert heavy["requeues"] == 0
    # The same through the SDK.
    sdk = cluster.client()
    by_account = {r["account"]: r for r in sdk.report(since=time.time() - 3600)}
    assert by_account["heavy"]["jobs"] == heavy["jobs"]
    assert {r["account"] for r in sdk.share()} == {"heavy", "light"}
    code, out, err = ctl(cluster, "report", "--by", "user", "--since", "1h")
    assert code == 0 and [r["user"] for r in out["rows"]] == [USER], err
    code, text, err = ctl(cluster, "-o", "csv", "report", "--since", "1h", json_out=False)
    assert code == 0, err
    table = list(csv.DictReader(io.StringIO(text)))
    assert {r["account"] for r in table} == {"heavy", "light"}
    assert {r["jobs_failed"] for r in table if r["account"] == "light"} == {"1"}
    code, text, err = ctl(cluster, "report", "--since", "1h", json_out=False)
    assert code == 0 and "GPU_H" in text and "light" in text, err
    # Bad input: one sentence, exit 2.
    code, _, err = ctl(cluster, "report", "--since", "1h", "--until", "2h")
    assert code == 2 and "--until must be after --since" in err
    code, _, err = ctl(cluster, "report", "--since", "yesterday-ish")
    assert code == 2 and "--since 'yesterday-ish'" in err
    code, _, err = ctl(cluster, "-o", "csv", "jobs")
    assert code == 2 and "-o csv is for report and share" in err


def test_metrics_carry_the_account(cluster: LocalCluster) -> None:
    with urllib.request.urlopen(cluster.url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    assert 'trellis_account_jobs_ended_total{account="heavy",state="finished"} 3.0' in text
    assert 'trellis_account_jobs_ended_total{account="light",state="failed"} 1.0' in text
    assert 'trellis_account_fairshare_factor{account="light"}' in text
    assert 'trellis_account_jobs{account="heavy",state="queued"} 0.0' in text
    # One series per account, never per job.
    assert "heavy-next" not in text


def test_usage_survives_a_master_restart(cluster: LocalCluster) -> None:
    before = share(cluster)
    cluster.restart_master(signal.SIGKILL)
    after = share(cluster)
    assert set(after) == set(before)
    for account, row in before.items():
        # Seconds passed: a 7-day half-life changes nothing in the sixth digit.
        assert after[account]["raw_usage"] == pytest.approx(row["raw_usage"], rel=1e-3)
        assert after[account]["factor"] == pytest.approx(row["factor"], rel=1e-3)
    code, out, err = ctl(cluster, "report", "--since", "1h")
    assert code == 0 and {r["account"] for r in out["rows"]} == {"heavy", "light"}, err


def test_whatif_replays_the_real_journal(cluster: LocalCluster, tmp_path: Path) -> None:
    journal = cluster.root / "master" / "master.db"
    proc = subprocess.run(
        [sys.executable, "-m", "sim.cli", "whatif", "--journal", str(journal),
         "--policies", "fifo,qssf", "--fairshare", "--json", str(tmp_path / "w.json")],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "actual" in proc.stdout and "fifo+fairshare" in proc.stdout
    assert "share heavy" in proc.stdout and "share light" in proc.stdout
    import json

    runs = json.loads((tmp_path / "w.json").read_text())["runs"]
    assert [r["name"] for r in runs] == ["actual", "fifo+fairshare", "qssf+fairshare"]
    assert all(r["jobs"] == 5 for r in runs)
    # Replayed on the journal's own node, each job for its measured run time: the GPU-hours
    # shares come out as they really were.
    for r in runs[1:]:
        assert r["shares"]["heavy"] == pytest.approx(runs[0]["shares"]["heavy"], abs=0.05)
