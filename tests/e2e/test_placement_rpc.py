"""The placement RPC for inference services, end to end: a real master, real node daemons,
replicas started as real processes, preemption of a training job through the master's path.

Two node daemons on this 2-core machine each offer both cores, so the master sees 4 cores and
4 emulated GPUs: enough for a CPU replica to hand over to two GPU replicas (make before break).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from control.client import MasterClient, RpcError
from demo.cluster import LocalCluster, default_job_user

USER = default_job_user()
SERVICE = {"service": "resnet", "command": ["sleep", "600"], "user": USER, "bs_gpu": 10,
           "cpu_batch": 4, "cpu_cores": 1, "cpu_mbw_gbps": 1.0, "port": 9000}


def _cluster(make_cluster: Any) -> LocalCluster:
    return make_cluster(nodes=2, gpus_per_node=2, cgroup_mode="affinity",
                        extra_master={"inference": {"sustain_s": 0.0}})


def _wait(what: str, probe: Callable[[], Any], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _ready(client: MasterClient, service: str, kind: str, count: int) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        reply = client.call("place", {"service": service})
        eps = reply["endpoints"]
        ok = (len(eps) == count and all(e["kind"] == kind and e["ready"] for e in eps))
        return reply if ok else None

    return _wait(f"{count} ready {kind} replica(s) of {service}", probe)


def _jobs(client: MasterClient) -> dict[str, dict[str, Any]]:
    return {j["id"]: j for j in client.call("jobs")["jobs"]}


def test_services_switch_cpu_to_gpu_preempt_and_survive_a_restart(make_cluster: Any) -> None:
    cluster = _cluster(make_cluster)
    client = cluster.client()
    reply = client.call("register_service", SERVICE)
    assert reply["registered"] is True and reply["mode"] == "cpu"

    # Low load: one CPU replica on the CPU cores of a GPU node, a real process.
    cpu = _ready(client, "resnet", "cpu", 1)
    ep = cpu["endpoints"][0]
    assert ep["gpu"] is None and len(ep["cpus"]) == 1 and ep["address"] == "127.0.0.1"
    assert ep["port"] == 9000 + int(ep["replica"].rsplit("-", 1)[1])
    job = _jobs(client)[ep["job"]]
    assert job["kind"] == "inference" and job["state"] == "running"
    assert job["placement"][0]["cpus"] == ep["cpus"] and job["placement"][0]["gpus"] == []
    # The version is stable while nothing changes, so clients can cache the reply.
    assert client.call("place", {"service": "resnet"})["version"] == cpu["version"]

    # Load above bs_gpu and above what the CPU replica carries: GPU replicas replace it.
    client.call("report_load", {"service": "resnet", "load": 12})
    gpu = _ready(client, "resnet", "gpu", 2)
    assert gpu["version"] > cpu["version"]
    assert all(e["gpu"] is not None and len(e["cpus"]) == 1 for e in gpu["endpoints"])
    _wait("the CPU replica to be cancelled",
          lambda: _jobs(client)[ep["job"]]["state"] == "cancelled")

    # A training job fills the GPUs the replicas left; a load needing a third GPU preempts it.
    trainer = client.call("submit", {"job": {
        "name": "bert", "user": USER, "gpus": 2, "cpus": 1, "command": ["sleep", "600"]}})
    trainer_id = trainer["job"]["id"]
    _wait("the training job to run", lambda: _jobs(client)[trainer_id]["state"] == "running")
    client.call("report_load", {"service": "resnet", "qps": 200})  # 200/s x 0.1 s = 20
    _ready(client, "resnet", "gpu", 3)
    victim = _jobs(client)[trainer_id]
    assert victim["state"] == "queued" and victim["reason"].startswith("preempted")
    events = client.call("job", {"id": trainer_id})["events"]
    assert any(e["kind"] == "preempted" for e in events)

    # A killed master comes back with the service and adopts the replicas that still run.
    before = client.call("place", {"service": "resnet"})
    cluster.restart_master()
    cluster.wait_nodes(2)
    after = _ready(client, "resnet", "gpu", 3)
    assert {e["job"] for e in after["endpoints"]} == {e["job"] for e in before["endpoints"]}
    assert after["version"] > before["version"]
    listed = client.call("services")["services"]
    assert [s["service"] for s in listed] == ["resnet"] and listed[0]["ready"] == 3

    # Deregistering retires every replica; the preempted job gets its GPUs back.
    gone = client.call("deregister_service", {"service": "resnet"})
    assert sorted(gone["retired"]) == sorted(e["replica"] for e in after["endpoints"])
    _wait("the replicas to stop", lambda: all(
        _jobs(client)[e["job"]]["state"] == "cancelled" for e in after["endpoints"]))
    _wait("the preempted job to run again",
          lambda: _jobs(client)[trainer_id]["state"] == "running", timeout=30)
    assert client.call("services")["services"] == []


ERRORS = [
    ("place", {"service": "nope"}, "unknown_service", "'nope' is not registered"),
    ("report_load", {"service": "nope", "load": 1}, "unknown_service", "not registered"),
    ("deregister_service", {"service": "nope"}, "unknown_service", "not registered"),
    ("report_load", {"service": "svc", "load": -1}, "invalid_params", "load"),
    ("report_load", {"service": "svc", "qps": -5.0}, "invalid_params", "qps"),
    ("report_load", {"service": "svc", "load": "high"}, "invalid_params", "load"),
    ("report_load", {"service": "svc"}, "invalid_params", "exactly one"),
    ("report_load", {"service": "svc", "load": 1, "qps": 2}, "invalid_params", "exactly one"),
    ("place", {}, "invalid_params", "service"),
    ("place", {"service": "svc", "extra": 1}, "invalid_params", "extra"),
    ("place", {"service": ["svc"]}, "invalid_params", "service"),
    ("register_service", {**SERVICE, "service": "x", "window_ms": 300}, "invalid_params",
     "QoS target"),
    ("register_service", {**SERVICE, "service": "x", "cpu_cores": 0}, "invalid_params",
     "cpu_cores"),
    ("register_service", {**SERVICE, "service": "x", "bs_gpu": 0}, "invalid_params", "bs_gpu"),
    ("register_service", {**SERVICE, "service": "a" * 41}, "invalid_params", "longer than"),
    ("register_service", {**SERVICE, "service": "../etc"}, "invalid_params", "service"),
    ("register_service", {**SERVICE, "service": "x", "command": []}, "invalid_params",
     "command"),
    ("register_service", {k: v for k, v in SERVICE.items() if k != "bs_gpu"},
     "invalid_params", "bs_gpu"),
    ("register_service", {**SERVICE, "service": "x", "user": "no-such-user-zz"},
     "unknown_user", "does not exist"),
]


def test_placement_rpc_errors_are_clear(make_cluster: Any) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=1, cgroup_mode="affinity")
    client = cluster.client()
    client.call("drain", {"node": cluster.node_name(1)})  # nothing needs to run here
    client.call("register_service", {**SERVICE, "service": "svc"})
    for method, params, code, words in ERRORS:
        with pytest.raises(RpcError) as err:
            client.call(method, params)
        assert err.value.code == code, (method, params, err.value)
        assert words in err.value.message, (method, params, err.value.message)
    # Nothing half-registered was left behind by the refused registrations.
    assert [s["service"] for s in client.call("services")["services"]] == ["svc"]
    assert client.call("place", {"service": "svc"})["endpoints"] == []
