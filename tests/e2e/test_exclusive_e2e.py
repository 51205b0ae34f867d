"""End-to-end on real daemons: an exclusive job (trellisctl submit --exclusive) gets a whole
idle node, every GPU of it visible to the job, and no other job is placed beside it."""

from __future__ import annotations

from tests.e2e.test_cluster import ctl, submit, wait_states


def test_an_exclusive_job_has_its_node_to_itself(make_cluster, shared_dir) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=2)
    busy = submit(cluster, "--gpus", "1", "--", "sleep", "30")
    running = wait_states(cluster, [busy], {"running"}, timeout=60)
    (busy_node,) = running[busy]["nodes"]
    seen = shared_dir / "trellis-test-exclusive-gpus"
    whole = submit(cluster, "--gpus", "1", "--exclusive", "--", "sh", "-c",
                   f'echo "$CUDA_VISIBLE_DEVICES" > {seen}; sleep 3')
    beside = submit(cluster, "--gpus", "1", "--", "true")
    done = wait_states(cluster, [whole], {"finished", "failed"}, timeout=60)
    assert done[whole]["state"] == "finished", done[whole]
    (node,) = done[whole]["nodes"]
    assert node != busy_node
    (alloc,) = done[whole]["placement"]
    assert len(alloc["gpus"]) == 2, alloc
    assert len(seen.read_text().strip().split(",")) == 2
    # The 1-GPU job went beside the first one, never onto the exclusive job's node.
    code, shown, err = ctl(cluster, "show", beside)
    assert code == 0, err
    assert shown["job"]["nodes"] in ([], [busy_node]), shown["job"]
    code, _, err = ctl(cluster, "cancel", busy)
    assert code == 0, err
