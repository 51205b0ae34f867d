"""End-to-end on real daemons: a production job preempts a running preemptible one. The
victim gets its own --signal (SIGUSR1) with $TRELLIS_PREEMPTED_FILE saying why, checkpoints
and exits within its class's grace, is requeued with restarts + 1 while the production job
runs on the freed GPUs, then runs again and knows it was restarted."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_cluster import ctl, submit, wait_states

CLASSES = [
    {"name": "production", "priority": 100, "preempts": ["preemptible"]},
    {"name": "normal", "priority": 0, "default": True},
    {"name": "preemptible", "priority": -100, "preempt_grace_s": 20},
]


def test_a_production_job_preempts_a_warned_preemptible_one(make_cluster,
                                                           shared_dir: Path) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=2,
                           extra_master={"priority_classes": CLASSES})
    out = shared_dir
    script = (
        f'if [ "$TRELLIS_RESTART_COUNT" = 1 ]; then echo again > {out}/again; exit 0; fi\n'
        f'trap \'cat "$TRELLIS_PREEMPTED_FILE" > {out}/why; exit 0\' USR1\n'
        f'echo up > {out}/up\n'
        'while :; do sleep 0.2; done\n')
    low = submit(cluster, "--name", "low", "--gpus", "2", "--priority-class", "preemptible",
                 "--signal", "USR1@60", "--", "sh", "-c", script)
    cluster.wait_for("the preemptible job to run", lambda: (out / "up").exists(), 60)
    prod = submit(cluster, "--name", "prod", "--gpus", "2", "--priority-class",
                  "production", "--", "sleep", "1")
    done = wait_states(cluster, [prod, low], {"finished", "failed", "cancelled"},
                       timeout=120)
    assert done[prod]["state"] == "finished", done[prod]
    assert done[low]["state"] == "finished" and done[low]["restarts"] == 1, done[low]
    assert (out / "why").read_text().strip() == f"for job {prod} of priority class production"
    assert (out / "again").exists()
    code, events, err = ctl(cluster, "events", "--job", low)
    assert code == 0, err
    kinds = [e["kind"] for e in events["events"]]
    assert kinds.index("preempted") < kinds.index("requeued"), kinds
    code, listing, err = ctl(cluster, "priority-classes")
    assert code == 0 and [c["name"] for c in listing["classes"]] == [
        "production", "normal", "preemptible"], (listing, err)
