"""Dependencies, holds, updates and QoS permissions against real daemons, through the real
trellisctl: a three-job pipeline runs in order and, when its first job fails, the rest are
cancelled with the reason naming the dependency; hold, release and update are journalled and
visible in `trellisctl events`; a client may not use urgent nor raise what concerns its job;
unknown ids and cycles are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.cluster import LocalCluster, default_job_user
from demo.harness import scratch_dir

ROOT = Path(__file__).resolve().parents[2]
USER = default_job_user()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with scratch_dir("trellis-test-deps-", mode=0o777) as root, \
            LocalCluster(root / "c", nodes=1, gpus_per_node=1, prefix="trellis-test-deps",
                         auth=True, extra_master={"clients_may_submit": True}) as c:
        c.start()
        yield c


@pytest.fixture
def out_dir(cluster: LocalCluster, request: pytest.FixtureRequest) -> Path:
    """A directory the jobs (run as USER) write into."""
    path = cluster.root.parent / request.node.name.replace("[", "-").replace("]", "")
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


def ctl(cluster: LocalCluster, role: str, *args: str) -> tuple[int, Any, str]:
    """trellisctl as ``role`` (admin or client): exit code, parsed JSON output, stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRELLIS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "control.cli", "--master", cluster.url, "--token-file",
         str(cluster.token_file(role)), "-o", "json", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    out: Any = proc.stdout
    if proc.returncode == 0 and proc.stdout.strip():
        out = json.loads(proc.stdout)
    return proc.returncode, out, proc.stderr


def text(cluster: LocalCluster, role: str, *args: str) -> str:
    """trellisctl's table/description output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRELLIS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "control.cli", "--master", cluster.url, "--token-file",
         str(cluster.token_file(role)), *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return cluster.client().call("job", {"id": job_id})["job"]  # type: ignore[no-any-return]


def ended(cluster: LocalCluster, *ids: str) -> list[dict[str, Any]] | None:
    views = [job(cluster, i) for i in ids]
    terminal = ("finished", "failed", "cancelled", "timeout")
    return views if all(v["state"] in terminal for v in views) else None


def submit(cluster: LocalCluster, job_id: str, command: str, *options: str,
           role: str = "admin") -> tuple[int, Any, str]:
    return ctl(cluster, role, "submit", "--id", job_id, "--cpus", "1", "--user", USER,
               *options, "--", "sh", "-c", command)


def test_a_pipeline_runs_in_order(cluster: LocalCluster, out_dir: Path) -> None:
    log = out_dir / "order"
    step = "echo {name} >> " + str(log) + "; sleep 0.5"
    for name, after in (("p-prep", None), ("p-train", "afterok:p-prep"),
                        ("p-eval", "afterok:p-train")):
        options = ("--after", after) if after else ()
        code, out, err = submit(cluster, name, step.format(name=name), *options)
        assert code == 0, err
        if after:
            assert out["job"]["wait"] == "dependency"
            assert out["job"]["reason"].startswith(f"waits for {after} (")
    views = cluster.wait_for("the pipeline to end",
                             lambda: ended(cluster, "p-prep", "p-train", "p-eval"))
    assert [v["state"] for v in views] == ["finished"] * 3
    assert log.read_text().split() == ["p-prep", "p-train", "p-eval"]
    prep, train, evaluate = views
    assert train["start_time"] >= prep["end_time"]
    assert evaluate["start_time"] >= train["end_time"]
    code, out, err = ctl(cluster, "admin", "events", "--job", "p-train")
    assert code == 0, err
    statuses = [e["detail"]["status"] for e in out["events"] if e["kind"] == "dependency"]
    assert statuses == ["waiting", "satisfied"]


def test_a_failing_first_job_cancels_the_rest_with_the_reason(cluster: LocalCluster) -> None:
    assert submit(cluster, "f-prep", "sleep 0.5; exit 3")[0] == 0
    assert submit(cluster, "f-train", "true", "-d", "afterok:f-prep")[0] == 0
    assert submit(cluster, "f-eval", "true", "--dependency", "afterok:f-train")[0] == 0
    prep, train, evaluate = cluster.wait_for(
        "the pipeline to end", lambda: ended(cluster, "f-prep", "f-train", "f-eval"))
    assert (prep["state"], prep["exit_code"]) == ("failed", 3)
    assert train["state"] == evaluate["state"] == "cancelled"
    assert train["start_time"] is None and evaluate["start_time"] is None
    assert train["reason"] == ("dependency afterok:f-prep can never be satisfied: f-prep "
                               "failed")
    assert evaluate["reason"] == ("dependency afterok:f-train can never be satisfied: "
                                  "f-train was cancelled")
    shown = text(cluster, "admin", "show", "f-train")
    assert "can never be satisfied: f-prep failed" in shown
    events = text(cluster, "admin", "events", "--job", "f-train")
    assert "dependency" in events and "status=never" in events


def test_an_array_is_waited_for_whole(cluster: LocalCluster, out_dir: Path) -> None:
    log = out_dir / "order"
    code, out, err = ctl(cluster, "admin", "submit", "--array", "0-1", "--id", "arr",
                         "--cpus", "1", "--user", USER, "--", "sh", "-c",
                         f'sleep 0.3; echo "task$TRELLIS_ARRAY_INDEX" >> {log}')
    assert code == 0, err
    assert [j["array"] for j in out["jobs"]] == [{"id": "arr", "index": 0},
                                                  {"id": "arr", "index": 1}]
    assert submit(cluster, "arr-report", f"echo report >> {log}", "-d", "afterok:arr")[0] == 0
    cluster.wait_for("the report to end", lambda: ended(cluster, "arr-report"))
    assert log.read_text().split()[-1] == "report"
    assert sorted(log.read_text().split()[:2]) == ["task0", "task1"]


def test_hold_release_and_update_are_journalled(cluster: LocalCluster) -> None:
    node = cluster.node_name(1)
    assert ctl(cluster, "admin", "drain", node)[0] == 0  # jobs stay queued meanwhile
    try:
        code, out, err = submit(cluster, "h-job", "true", "--qos", "prior", role="client")
        assert code == 0, err
        code, out, err = ctl(cluster, "client", "hold", "h-job")
        assert code == 0, err
        assert (out["job"]["held"], out["job"]["wait"]) == ("user", "held")
        wide = text(cluster, "client", "jobs", "--state", "queued", "-o", "wide")
        assert "WAIT" in wide.splitlines()[0]
        assert any(line.startswith("h-job") and " held " in line for line in wide.splitlines())
        shown = text(cluster, "client", "show", "h-job")
        assert "Waits:      held" in shown and "Held:       by its user" in shown
        # A user may lower what concerns their job, never raise it.
        code, out, err = ctl(cluster, "client", "update", "h-job", "--qos", "normal",
                             "--priority", "-3", "--time", "30")
        assert code == 0, err
        assert (out["job"]["qos"], out["job"]["priority"]) == ("normal", -3)
        for raise_ in (("--priority", "0"), ("--qos", "prior"), ("--qos", "urgent")):
            code, _, err = ctl(cluster, "client", "update", "h-job", *raise_)
            assert code == 1 and "forbidden" in err, err
        code, _, err = ctl(cluster, "client", "update", "h-job", "--time", "1:00:00")
        assert code == 1 and "lengthens it" in err, err
        code, _, err = ctl(cluster, "client", "update", "h-job", "--time", "1:61")
        assert code == 2 and "--time" in err, err
        # An admin's hold binds the client; the admin releases it.
        assert ctl(cluster, "admin", "hold", "h-job")[1]["job"]["held"] == "admin"
        code, _, err = ctl(cluster, "client", "release", "h-job")
        assert code == 1 and "held by an admin" in err, err
        code, out, err = ctl(cluster, "admin", "release", "h-job")
        assert code == 0 and out["job"]["held"] == "", err
        code, out, err = ctl(cluster, "admin", "events", "--job", "h-job")
        assert code == 0, err
        rows = [(e["kind"], e["detail"]) for e in out["events"]
                if e["kind"] in ("held", "released", "updated")]
        assert [kind for kind, _ in rows] == ["held", "updated", "held", "released"]
        assert rows[0][1]["by"] == "user" and rows[2][1]["by"] == "admin"
        assert rows[1][1]["qos"] == ["prior", "normal"]
        assert rows[1][1]["priority"] == [0, -3]
        assert rows[1][1]["time_limit_s"] == [None, 1800]
    finally:
        ctl(cluster, "admin", "undrain", node)
    cluster.wait_for("the released job to run", lambda: ended(cluster, "h-job"))


def test_a_client_may_not_use_urgent_nor_raise_its_priority(cluster: LocalCluster) -> None:
    code, _, err = submit(cluster, "u-job", "true", "--qos", "urgent", role="client")
    assert code == 1
    assert "forbidden" in err and "may not use qos urgent" in err
    code, _, err = submit(cluster, "u-job", "true", "--priority", "10", role="client")
    assert code == 1 and "only an admin may give a job a priority above 0" in err
    code, _, err = ctl(cluster, "client", "jobs")
    assert code == 0
    with pytest.raises(Exception, match="does not exist"):
        cluster.client().call("job", {"id": "u-job"})
    code, out, err = submit(cluster, "u-admin", "true", "--qos", "urgent", "--priority", "10")
    assert code == 0 and out["job"]["qos"] == "urgent", err


def test_unknown_ids_and_cycles_are_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    code, _, err = submit(cluster, "x-job", "true", "--after", "afterok:no-such-job")
    assert code == 1
    assert "unknown_dependency" in err and "no-such-job is neither a job nor an array" in err
    code, _, err = submit(cluster, "x-job", "true", "--after", "afterok:a?afterok:b")
    assert code == 2 and "'?' (any one of several) is not supported" in err
    path = tmp_path / "cycle.toml"
    path.write_text(f'user = "{USER}"\ncpus = 1\nkind = "cpu"\n\n'
                    '[[jobs]]\nid = "cy-a"\ncommand = ["true"]\nafter = "afterok:cy-b"\n\n'
                    '[[jobs]]\nid = "cy-b"\ncommand = ["true"]\nafter = "afterok:cy-a"\n')
    code, _, err = ctl(cluster, "admin", "submit", "-f", str(path))
    assert code == 1
    assert "2 of 2 job(s) refused" in err
    assert "dependency_cycle" in err and "cy-a -> cy-b -> cy-a" in err
    for job_id in ("x-job", "cy-a", "cy-b"):
        with pytest.raises(Exception, match="does not exist"):
            cluster.client().call("job", {"id": job_id})
