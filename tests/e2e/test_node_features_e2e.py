"""End-to-end: a node's configured features reach the master in its hello, and a job that
selects them (trellisctl submit -C / #SBATCH --constraint) runs only there; a feature no
node has is refused at submission with one sentence."""

from __future__ import annotations

from tests.e2e.test_cluster import ctl, submit, wait_states


def test_a_constrained_job_runs_on_the_node_with_its_features(make_cluster) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=2,
                           extra_node={2: {"features": ["ib", "nvlink"]}})
    code, out, err = ctl(cluster, "nodes")
    assert code == 0, err
    featured = [n["name"] for n in out["nodes"] if n["features"] == ["ib", "nvlink"]]
    plain = [n["name"] for n in out["nodes"] if n["features"] == []]
    assert len(featured) == 1 and len(plain) == 1, out["nodes"]
    # Each fills one node's GPUs: without the constraint the first would go anywhere.
    jobs = [submit(cluster, "--name", f"ib{i}", "--gpus", "2", "-C", "nvlink&ib", "--",
                   "true") for i in range(3)]
    done = wait_states(cluster, jobs, {"finished", "failed", "cancelled"}, timeout=120)
    assert all(done[j]["state"] == "finished" for j in jobs), done
    assert all(done[j]["nodes"] == featured for j in jobs), done
    code, shown, err = ctl(cluster, "show", jobs[0])
    assert code == 0 and shown["job"]["constraint"] == "nvlink&ib", err
    code, _, err = ctl(cluster, "submit", "--user", "nobody", "--gpus", "1", "-C", "hdr",
                       "--", "true")
    assert code == 1 and "no node has the feature hdr" in err, err
    code, _, err = ctl(cluster, "submit", "--user", "nobody", "--gpus", "1", "-C", "a&b|c",
                       "--", "true")
    assert code == 2 and "& and | cannot be mixed" in err, err
    # Any of them, and excluded nodes: the one featured node is excluded, so it cannot run.
    code, _, err = ctl(cluster, "submit", "--user", "nobody", "--gpus", "1", "-C", "ib|hdr",
                       "-x", featured[0], "--", "true")
    assert code == 1 and f"no node matches what it selects (with ib|hdr, not {featured[0]})" \
        in err, err
