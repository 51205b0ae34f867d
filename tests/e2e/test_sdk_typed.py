"""The typed SDK against a real master and node: every typed call, sync and async."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from control.aclient import AsyncMasterClient
from control.client import RpcError
from demo.cluster import default_job_user
from shared.model import Dependency, JobKind, JobSpec
from shared.views import JobDetail, JobView, MasterInfo, NodeDetail

USER = default_job_user()


def spec(name: str, seconds: int) -> JobSpec:
    return JobSpec(name=name, command=("sleep", str(seconds)), user=USER, kind=JobKind.CPU,
                   cpus=1)


def test_every_typed_call_against_a_real_master(make_cluster) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=2)
    client = cluster.client()
    info = client.ping()
    assert isinstance(info, MasterInfo) and info.policy
    long = client.submit(spec("sdk-long", 300))
    assert isinstance(long, JobView) and long.state == "queued"
    quick = client.submit_many([spec("sdk-a", 0), spec("sdk-b", 0)])
    assert [j.name for j in quick] == ["sdk-a", "sdk-b"]
    done = cluster.wait_for("the quick jobs to finish", lambda: all(
        client.job(j.id).job.state == "finished" for j in quick) or None)
    assert done is True
    running = cluster.wait_for("the long job to run", lambda: [
        j for j in client.jobs(state="running") if j.id == long.id] or None)
    assert running[0].nodes and running[0].placement[0].cpus
    detail = client.job(long.id)
    assert isinstance(detail, JobDetail)
    assert [e.kind for e in detail.events][:1] == ["submitted"]
    nodes = client.nodes()
    assert len(nodes) == 1 and long.id in nodes[0].jobs
    node = client.node(nodes[0].name)
    assert isinstance(node, NodeDetail) and node.jobs[0].id == long.id
    page = client.events(job=long.id)
    assert page.events and page.last >= page.events[-1].seq
    # Waiting for the long job, so it is still queued when held (nothing races the hold).
    held = client.submit(replace(spec("sdk-held", 0),
                                 after=(Dependency("afterany", (long.id,)),)))
    assert (held.wait, held.after) == ("dependency", f"afterany:{long.id}")
    view = client.hold(held.id)
    assert (view.held, view.wait) == ("admin", "held")  # the cluster's client is an admin
    assert client.update(held.id, priority=-5).priority == -5
    released = client.release(held.id)
    assert (released.held, released.wait) == ("", "dependency")
    assert client.drain(nodes[0].name) == "drained"
    assert client.undrain(nodes[0].name) == "ready"
    assert client.cancel(long.id).id == long.id
    with pytest.raises(RpcError) as refused:
        client.cancel("no-such-job")
    assert refused.value.code == "unknown_job"

    async def the_async_twin() -> None:
        token = None
        async with AsyncMasterClient(cluster.url, timeout=10, token=token) as master:
            assert (await master.ping()).version == info.version
            job = await master.submit(spec("sdk-async", 0))
            listed = await master.jobs()
            assert job.id in {j.id for j in listed}
            assert (await master.job(job.id)).job.user == USER
            assert len(await master.nodes()) == 1

    asyncio.run(the_async_twin())
