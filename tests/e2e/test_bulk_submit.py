"""Bulk submission against a real master: ``trellisctl submit --array`` and files of jobs go in
one ``submit_many`` call and one journal transaction, all or none, refusals named by index;
each array job sees its index. Also the asyncio client against the same master."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from control.aclient import AsyncMasterClient
from control.client import RpcError, Unreachable
from demo.cluster import LocalCluster, default_job_user
from demo.harness import scratch_dir

ROOT = Path(__file__).resolve().parents[2]
USER = default_job_user()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with scratch_dir("trellis-test-bulk-", mode=0o777) as root, \
            LocalCluster(root / "c", nodes=1, gpus_per_node=1,
                         prefix="trellis-test-bulk") as c:
        c.start()
        yield c


def ctl(cluster: LocalCluster, *args: str) -> tuple[int, Any, str]:
    proc = subprocess.run([sys.executable, "-m", "control.cli", "--master", cluster.url,
                           "-o", "json", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    out: Any = proc.stdout
    if proc.returncode == 0 and out.strip():
        out = json.loads(out)
    return proc.returncode, out, proc.stderr


def transactions(cluster: LocalCluster) -> float:
    with urllib.request.urlopen(cluster.url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "trellis_journal_transactions":
            return next(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("no trellis_journal_transactions_total in /metrics")


def job_ids(cluster: LocalCluster) -> set[str]:
    return {j["id"] for j in cluster.client().call("jobs")["jobs"]}


def test_array_in_one_call_and_one_transaction(cluster: LocalCluster) -> None:
    node = cluster.node_name(1)
    cluster.client().call("drain", {"node": node})  # jobs queue: no other journal writes
    try:
        before = transactions(cluster)
        code, out, err = ctl(cluster, "submit", "--array", "0-999", "--name", "sweep",
                             "--cpus", "1", "--user", USER, "--", "true")
        after = transactions(cluster)
    finally:
        cluster.client().call("undrain", {"node": node})
    assert code == 0, err
    jobs = out["jobs"]
    assert len(jobs) == 1000
    assert [j["name"] for j in jobs] == [f"sweep_{i}" for i in range(1000)]
    assert after - before == 1, "1,000 submissions should share one journal transaction"
    for job in jobs:
        cluster.client().call("cancel", {"id": job["id"]})


def test_each_array_job_sees_its_index(cluster: LocalCluster) -> None:
    code, out, err = ctl(cluster, "submit", "--array", "1-3", "--id", "exits", "--cpus", "1",
                         "--user", USER, "--", "sh", "-c", 'exit "$TRELLIS_ARRAY_INDEX"')
    assert code == 0, err
    assert [j["id"] for j in out["jobs"]] == ["exits_1", "exits_2", "exits_3"]

    def ended() -> list[dict[str, Any]] | None:
        views = [cluster.client().call("job", {"id": f"exits_{i}"})["job"] for i in (1, 2, 3)]
        return views if all(v["state"] in ("finished", "failed") for v in views) else None

    views = cluster.wait_for("the array's jobs to end", ended, timeout=60)
    assert [v["exit_code"] for v in views] == [1, 2, 3]


def test_a_file_of_jobs(cluster: LocalCluster, tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(f'user = "{USER}"\ncpus = 1\nkind = "cpu"\n\n'
                    '[[jobs]]\nid = "file-a"\ncommand = ["true"]\n\n'
                    '[[jobs]]\nid = "file-b"\ncommand = ["sleep", "0"]\ntenant = "audio"\n')
    code, out, err = ctl(cluster, "submit", "-f", str(path))
    assert code == 0, err
    assert [(j["id"], j["tenant"]) for j in out["jobs"]] == [("file-a", "default"),
                                                             ("file-b", "audio")]


def test_a_bad_batch_is_refused_whole_with_every_refusal_by_index(cluster: LocalCluster,
                                                                  tmp_path: Path) -> None:
    taken = cluster.client().call("submit", {"job": {
        "name": "taken", "command": ["true"], "user": USER, "kind": "cpu"}, "id": "taken"})
    assert taken["job"]["id"] == "taken"
    before = job_ids(cluster)
    good = {"command": ["true"], "user": USER, "kind": "cpu"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"jobs": [
        good,
        {**good, "gpus": -1},
        {**good, "user": "no-such-user-xyz"},
        {**good, "id": "taken"},
        {**good, "id": "twice"},
        {**good, "id": "twice"},
        {**good, "bogus_field": 1},
    ]}))
    code, _, err = ctl(cluster, "submit", "-f", str(path))
    assert code == 1, err
    assert "batch_refused: 5 of 7 job(s) refused; no job was submitted\n" in err
    for line in ("jobs[1]: invalid_params: jobs[1].gpus: must be at least 0, got -1",
                 "jobs[2]: unknown_user:", "jobs[3]: duplicate_job:",
                 "jobs[5]: duplicate_job: job id 'twice' already exists in this batch",
                 "jobs[6]: invalid_params: jobs[6]: unknown field(s) 'bogus_field'"):
        assert line in err, err
    assert "jobs[0]" not in err and "jobs[4]" not in err
    assert job_ids(cluster) == before  # nothing of the batch was kept

    good["name"] = "g"  # the RPC, unlike trellisctl, fills in nothing
    with pytest.raises(RpcError) as refused:
        cluster.client().call("submit_many", {"jobs": [good, {**good, "cpus": "x"}]})
    assert refused.value.code == "batch_refused"
    assert refused.value.detail == {"jobs": 2, "refused": [
        {"index": 1, "code": "invalid_params",
         "message": "jobs[1].cpus: must be an integer, got a string"}], "accepted": []}
    for params, message in (({"jobs": []}, "must hold at least one job"),
                            ({"jobs": [good], "ids": ["a", "b"]}, "has 2 entries for 1 jobs"),
                            ({"jobs": "x"}, "params.jobs: must be a list")):
        with pytest.raises(RpcError, match=message) as err_:
            cluster.client().call("submit_many", params)
        assert err_.value.code == "invalid_params"


def test_array_usage_errors(cluster: LocalCluster) -> None:
    code, _, err = ctl(cluster, "submit", "--array", "9-1", "--", "true")
    assert code == 2 and "range '9-1' ends before it starts" in err
    code, _, err = ctl(cluster, "submit", "--array", "0-3%2", "--", "true")
    assert code == 2 and "%N limit" in err


def test_async_client(cluster: LocalCluster) -> None:
    async def scenario() -> None:
        async with AsyncMasterClient(cluster.url, timeout=10) as master:
            pings = await asyncio.gather(*(master.call("ping") for _ in range(5)))
            assert all(p["policy"] == "fifo" for p in pings)
            with pytest.raises(RpcError) as err:
                await master.call("job", {"id": "no-such-job"})
            assert err.value.code == "unknown_job"
        async with AsyncMasterClient("http://127.0.0.1:9", timeout=2) as dead:
            with pytest.raises(Unreachable, match="cannot reach the master"):
                await dead.call("ping")

    asyncio.run(scenario())
