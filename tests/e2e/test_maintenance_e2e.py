"""End-to-end on real daemons: an admin plans a maintenance window with trellisctl; inside it
its node reads maintenance and jobs run on the other node; a job whose limit would cross a
window ahead avoids its node; a window in the past is refused in one sentence; removing it
gives the node back."""

from __future__ import annotations

from tests.e2e.test_cluster import ctl, submit, wait_states


def test_a_window_keeps_jobs_off_its_node(make_cluster) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=2)
    n1, n2 = sorted(n["name"] for n in ctl(cluster, "nodes")[1]["nodes"])
    code, _, err = ctl(cluster, "maintenance", "plan", "now", "--nodes", n1, "--start",
                       "now", "--duration", "1:00:00", "--reason", "kernel upgrade")
    assert code == 0, err
    code, _, err = ctl(cluster, "maintenance", "plan", "later", "--nodes", n2, "--start",
                       "now+3:00:00", "--duration", "1:00:00")
    assert code == 0, err
    cluster.wait_for(f"{n1} in maintenance", lambda: {
        n["name"]: n["status"] for n in ctl(cluster, "nodes")[1]["nodes"]}[n1] == "maintenance",
        30)
    # n1 is in its window; n2's begins in three hours: a 1-hour job fits before it.
    ok = submit(cluster, "--gpus", "1", "--time", "1:00:00", "--", "true")
    # A job without a limit could run into n2's window, and n1 is closed: it waits.
    endless = submit(cluster, "--gpus", "1", "--", "sleep", "1")
    done = wait_states(cluster, [ok], {"finished", "failed"}, timeout=60)
    assert done[ok]["state"] == "finished" and done[ok]["nodes"] == [n2], done[ok]
    code, shown, err = ctl(cluster, "show", endless)
    assert code == 0 and shown["job"]["state"] == "queued", shown
    code, listing, err = ctl(cluster, "maintenance", "list")
    assert code == 0 and [(w["name"], w["state"]) for w in listing["windows"]] == [
        ("now", "active"), ("later", "planned")], listing
    code, _, err = ctl(cluster, "maintenance", "plan", "old", "--nodes", n1, "--start",
                       "2020-01-01 00:00", "--duration", "1:00:00")
    assert code == 1 and "maintenance window 'old' is in the past" in err, err
    for name in ("now", "later"):
        code, _, err = ctl(cluster, "maintenance", "remove", name)
        assert code == 0, err
    done = wait_states(cluster, [endless], {"finished", "failed"}, timeout=60)
    assert done[endless]["state"] == "finished", done[endless]
