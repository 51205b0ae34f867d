"""Jobs run as their submitter's Unix user: the master and noded each refuse the wrong ones."""

from __future__ import annotations

import time

import pytest

from control.client import RpcError
from demo.cluster import LocalCluster
from tests.conftest import needs_root


def job(user: str, name: str = "who") -> dict:
    return {"job": {"name": name, "command": ["true"], "user": user, "kind": "cpu"}}


def test_master_refuses_root_and_users_off_its_list(make_cluster) -> None:
    cluster = make_cluster(nodes=1, extra_master={"allowed_users": ["nobody"]})
    client = cluster.client()
    for user, fragment in (("root", "may not run as root"),
                           ("daemon", "'daemon' is not on the allowed list")):
        with pytest.raises(RpcError) as err:
            client.call("submit", job(user))
        assert err.value.code == "user_refused" and fragment in err.value.message
    assert client.call("jobs")["jobs"] == []


def wait_terminal(cluster: LocalCluster, job_id: str, timeout: float = 30) -> dict:
    client = cluster.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.call("job", {"id": job_id})
        if view["job"]["state"] in ("finished", "failed", "cancelled"):
            return view
        time.sleep(0.2)
    raise AssertionError(f"{job_id} still {view['job']['state']}: {view['events'][-5:]}\n"
                         + cluster.log("master"))


@needs_root
@pytest.mark.parametrize(
    ("master_extra", "node_extra", "user", "fragment"),
    [
        ({"allowed_users": ["nobody", "daemon"]}, {"allowed_users": ["nobody"]}, "daemon",
         "user 'daemon' is not allowed on"),
        ({"allow_root_jobs": True}, {}, "root", "does not run jobs as root"),
    ],
)
def test_noded_checks_again_before_starting_anything(make_cluster, master_extra: dict,
                                                     node_extra: dict, user: str,
                                                     fragment: str) -> None:
    cluster = make_cluster(nodes=1, extra_master=master_extra, node_settings=node_extra)
    client = cluster.client()
    job_id = client.call("submit", job(user))["job"]["id"]
    view = wait_terminal(cluster, job_id)
    assert view["job"]["state"] == "failed"
    assert fragment in view["job"]["reason"]
    # Refused once, not retried in a loop.
    placed = [e for e in view["events"] if e["kind"] == "placed"]
    assert len(placed) == 1, view["events"]
    node_log = cluster.log(cluster.node_name(1))
    assert "started shim_pid" not in node_log
    # A permitted job still runs on the same node afterwards.
    ok = client.call("submit", job("nobody", "fine"))["job"]["id"]
    assert wait_terminal(cluster, ok)["job"]["state"] == "finished"
