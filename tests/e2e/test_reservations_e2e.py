"""End-to-end on real daemons: an admin creates a reservation with trellisctl; while it lasts
its node reads reserved, a job in it runs there and nowhere else, and another job without a
time limit waits; a reservation for someone else is refused at submission, one in the past at
creation; deleting it gives the node back."""

from __future__ import annotations

from tests.e2e.test_cluster import USER, ctl, submit, wait_states


def test_a_reservation_keeps_its_node_for_its_users(make_cluster) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=2)
    n1, n2 = sorted(n["name"] for n in ctl(cluster, "nodes")[1]["nodes"])
    code, made, err = ctl(cluster, "reservation", "create", "trellis-test-course", "--nodes",
                          n1, "--start", "now", "--duration", "1:00:00", "--users", USER,
                          "--reason", "course")
    assert code == 0 and made["reservation"]["gpus"] == 2, err
    code, _, err = ctl(cluster, "reservation", "create", "trellis-test-later", "--nodes", n2,
                       "--start", "now+3:00:00", "--duration", "1:00:00", "--users", "root")
    assert code == 0, err
    cluster.wait_for(f"{n1} reserved", lambda: {
        n["name"]: n["status"] for n in ctl(cluster, "nodes")[1]["nodes"]}[n1] == "reserved",
        30)
    # Two jobs in the reservation: both run on its node, one after the other.
    mine = [submit(cluster, "--gpus", "2", "--reservation", "trellis-test-course", "--",
                   "true") for _ in range(2)]
    # Outside it, without a limit: n1 is reserved, n2's reservation lies ahead: it waits.
    endless = submit(cluster, "--gpus", "1", "--", "sleep", "1")
    done = wait_states(cluster, mine, {"finished", "failed"}, timeout=60)
    assert all(done[j]["state"] == "finished" and done[j]["nodes"] == [n1] for j in mine), done
    code, shown, err = ctl(cluster, "show", endless)
    assert code == 0 and shown["job"]["state"] == "queued", shown
    assert "reservation trellis-test-later" in shown["job"]["reason"], shown["job"]
    code, _, err = ctl(cluster, "submit", "--user", USER, "--gpus", "1", "--reservation",
                       "trellis-test-later", "--", "true")
    assert code == 1 and f"is for user root, not user {USER!r}" in err, err
    code, _, err = ctl(cluster, "reservation", "create", "trellis-test-old", "--nodes", n1,
                       "--start", "2020-01-01 00:00", "--duration", "1:00:00", "--users", USER)
    assert code == 1 and "reservation 'trellis-test-old' is in the past" in err, err
    code, listing, err = ctl(cluster, "reservation", "list")
    assert code == 0 and [(r["name"], r["state"]) for r in listing["reservations"]] == [
        ("trellis-test-course", "active"), ("trellis-test-later", "planned")], listing
    for name in ("trellis-test-course", "trellis-test-later"):
        code, _, err = ctl(cluster, "reservation", "delete", name)
        assert code == 0, err
    done = wait_states(cluster, [endless], {"finished", "failed"}, timeout=60)
    assert done[endless]["state"] == "finished", done[endless]
