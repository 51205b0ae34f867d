"""End-to-end: partitions configured on a real master with real nodes. A job naming none runs
in the default partition's nodes with its default time; -p (and #SBATCH -p) puts it on the
other's; what no partition admits is refused with one sentence; trellisctl partitions shows
them; an admin takes one down and up again; SIGHUP moves a node into another partition and
the next job follows."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.cluster import LocalCluster, default_job_user
from demo.harness import scratch_dir
from tests.e2e.cli import ctl as ctl_text
from tests.e2e.test_cluster import ctl, wait_states

USER = default_job_user()
PREFIX = "trellis-test-parts"
N1, N2 = f"{PREFIX}-n1", f"{PREFIX}-n2"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    partitions = [
        {"name": "main", "nodes": N1, "default": True, "max_time_s": 3600,
         "default_time_s": 600},
        {"name": "debug", "nodes": N2, "max_time_s": 300},
    ]
    with scratch_dir("trellis-test-parts-", mode=0o777) as root, LocalCluster(
            root / "c", prefix=PREFIX, nodes=2, gpus_per_node=2,
            extra_master={"partitions": partitions}) as c:
        c.start()
        c.scripts = root  # type: ignore[attr-defined]  # the job's user may read it
        yield c


def submit(cluster: LocalCluster, *args: str) -> dict:
    code, out, err = ctl(cluster, "submit", "--user", USER, "--gpus", "1", *args)
    assert code == 0, err
    return out["job"]


def test_jobs_run_in_their_partitions_and_a_reload_moves_a_node(
        cluster: LocalCluster) -> None:
    plain = submit(cluster, "--", "true")
    assert (plain["partition"], plain["time_limit_s"]) == ("main", 600)
    debug = submit(cluster, "-p", "debug", "--", "true")
    assert (debug["partition"], debug["time_limit_s"]) == ("debug", 300)
    script = Path(cluster.scripts) / "job.sh"  # type: ignore[attr-defined]
    script.write_text(f"#!/bin/sh\n#SBATCH -p debug,main\n#SBATCH -t 10:00\n"
                      f"#SBATCH -D {script.parent}\ntrue\n")
    script.chmod(0o755)
    scripted = submit(cluster, str(script))
    assert scripted["partition"] == "main"  # debug takes at most 5 minutes
    ids = [plain["id"], debug["id"], scripted["id"]]
    done = wait_states(cluster, ids, {"finished", "failed", "cancelled"}, timeout=120)
    assert [done[j]["state"] for j in ids] == ["finished"] * 3, {
        j: (done[j]["state"], done[j]["reason"]) for j in ids}
    assert done[plain["id"]]["nodes"] == [N1] and done[scripted["id"]]["nodes"] == [N1]
    assert done[debug["id"]]["nodes"] == [N2]

    code, _, err = ctl(cluster, "submit", "--user", USER, "-p", "debug", "-t", "1:00:00",
                       "--", "true")
    assert code == 1 and err.strip().endswith(
        "partition 'debug' takes time limits up to 5min (this job asks 1h)"), err
    code, _, err = ctl(cluster, "submit", "--user", USER, "-p", "gpu", "--", "true")
    assert code == 1 and "no partition 'gpu' (partitions: main, debug)" in err, err
    code, listing, err = ctl(cluster, "partitions")
    assert code == 0, err
    rows = {p["name"]: p for p in listing["partitions"]}
    assert (rows["main"]["default"], rows["main"]["node_count"], rows["main"]["gpus"]) == (
        True, 1, 2)
    code, text, err = ctl_text(cluster, "partitions", json_out=False)
    assert code == 0 and text.splitlines()[1].split()[:4] == ["main*", "up", "1/1", "2/2"], text

    # An admin takes debug down: its job queues and waits; back up, it runs.
    code, text, err = ctl_text(cluster, "partition", "update", "debug", "--state", "down",
                               "--reason", "fabric repair", json_out=False)
    assert code == 0 and text.strip() == "partition debug is down", (text, err)
    waiting = submit(cluster, "-p", "debug", "--", "true")
    cluster.wait_for("the down partition's job to say why it waits", lambda: "starts no job"
                     in (ctl(cluster, "show", waiting["id"])[1]["job"]["reason"] or ""), 30)
    code, _, err = ctl(cluster, "partition", "update", "debug", "--state", "up")
    assert code == 0, err
    done = wait_states(cluster, [waiting["id"]], {"finished", "failed"}, timeout=60)
    assert done[waiting["id"]]["nodes"] == [N2], done[waiting["id"]]

    # SIGHUP: main now holds both nodes, debug none of them.
    config = cluster.root / "master.toml"
    config.write_text(config.read_text().replace(f'"nodes" = "{N2}"', '"nodes" = "none-1"')
                      .replace(f'"nodes" = "{N1}"', f'"nodes" = "{PREFIX}-n[1-2]"'))
    assert cluster.master is not None and cluster.master.proc is not None
    cluster.master.proc.send_signal(signal.SIGHUP)
    cluster.wait_for("main to hold both nodes", lambda: {
        p["name"]: p["node_count"] for p in cluster.client().call("partitions")["partitions"]
    } == {"main": 2, "debug": 0}, 30)
    both = submit(cluster, "--gpus", "4", "--", "true")
    done = wait_states(cluster, [both["id"]], {"finished", "failed", "cancelled"}, timeout=120)
    assert done[both["id"]]["state"] == "finished" and sorted(done[both["id"]]["nodes"]) == [
        N1, N2], done
