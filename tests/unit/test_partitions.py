"""Partitions (shared/partitions.py, masterd/features/partitions.py): a configuration is
validated in one sentence per mistake; a job runs only on its partitions' nodes under every
policy; at submission the default partition and its default time are written into the job,
named partitions that do not admit it are dropped and a job none admits is refused; SIGHUP
re-labels the nodes and keeps a removed partition that queued jobs still need; trellisctl
spells it as Slurm does."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from control.cli import build_parser
from control.submit import jobs_from_args
from control.usage import UsageError
from control.views import show_partitions
from masterd.api.authn import CLIENT_METHODS
from masterd.api.rpc import Rpc
from masterd.core.policies import REGISTRY, make_policy
from masterd.core.policy import Start
from masterd.core.scheduler import SchedulingCore
from masterd.core.waiting import WaitExplainer
from masterd.service.master import Master
from shared.model import NodeSelector
from shared.partitions import Choice, Partition, PartitionError, PartitionTable, duration
from shared.schema import decode
from tests.unit.helpers import inventory, job
from tests.unit.master_fakes import through_rpc
from tests.unit.test_holds_updates import ADMIN, ALICE, as_, refused

GPU = Partition("gpu", "n[1-2]", default=True, max_time_s=7200, default_time_s=3600)
DEBUG = Partition("debug", "n3", max_time_s=1800, deny_accounts=("guests",))
EVERY = Partition("all", "ALL", allow_accounts=("ops",))


def test_a_configuration_is_checked_in_one_sentence_per_mistake() -> None:
    for partitions, why in (
        ([GPU, GPU], "partition 'gpu' is configured twice"),
        ([GPU, replace(DEBUG, default=True)], "'gpu', 'debug' are each marked default"),
        ([replace(GPU, default_time_s=9000)], "default_time_s 9000 exceeds max_time_s 7200"),
        ([replace(DEBUG, allow_accounts=("a",))], "allow_accounts or deny_accounts, not both"),
        ([replace(DEBUG, nodes="n[3-")], "partition 'debug': nodes 'n[3-'"),
        ([replace(DEBUG, nodes="n[5-3]")], "range '5-3' is empty"),
    ):
        with pytest.raises(PartitionError, match=re.escape(why)):
            PartitionTable.of(partitions)
    with pytest.raises(ValueError, match="configured twice"):
        decode_master(partitions=[dataclasses.asdict(GPU)] * 2)


def decode_master(**config: Any) -> Any:
    from shared.config import MasterConfig

    return decode(MasterConfig, {"state_dir": "/nonexistent", **config}, "master")


def test_a_job_goes_where_it_is_admitted_with_the_default_time() -> None:
    table = PartitionTable.of([GPU, DEBUG, EVERY])
    assert table.of_node("n1") == ("gpu", "all") and table.of_node("n9") == ("all",)
    assert table.unknown_nodes(["n1", "n3"]) == {"gpu": ["n2"]}
    # None named: the default partition, and its default time where the job asks none.
    assert table.choose((), "vision", None) == Choice(("gpu",), 3600)
    assert table.choose((), "vision", 600).time_limit_s == 600
    # Several named: those that admit it; the tightest default, so each admits it.
    assert table.choose(("gpu", "debug"), "vision", None) == Choice(("gpu", "debug"), 1800)
    assert table.choose(("gpu", "debug"), "vision", 3000).partitions == ("gpu",)
    for named, account, limit, why in (
        (("debug",), "vision", 3600, "partition 'debug' takes time limits up to 30min "
                                     r"\(this job asks 1h\)"),
        (("debug", "all"), "guests", 60, "partition 'debug' does not admit account 'guests'; "
                                         "partition 'all' admits only accounts ops"),
        (("gpu", "nope"), "vision", 60, r"no partition 'nope' \(partitions: gpu, debug, all\)"),
    ):
        with pytest.raises(PartitionError, match=why):
            table.choose(named, account, limit)
    with pytest.raises(PartitionError, match="no default partition: name one with "
                                             "--partition"):
        PartitionTable.of([DEBUG]).choose((), "vision", None)
    assert [duration(s) for s in (90, 1800, 5400, 7200, 93600)] == [
        "90s", "30min", "90min", "2h", "1d2h"]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_places_a_job_only_on_its_partitions_nodes(name: str) -> None:
    core = SchedulingCore(make_policy(name))
    # a is every placer's best fit (fewest GPUs) but only b is in partition "big".
    core.node_up(replace(inventory("a", gpus=4, cpus=16), partitions=("small",)))
    core.node_up(replace(inventory("b", gpus=8, cpus=16), partitions=("big", "small")))
    core.submit(job("in-big", gpus=2, t=0, iterations=1000, batch=64, model_type="resnet50",
                    selector=NodeSelector(partitions=("big",))))
    started: dict[str, tuple[str, ...]] = {}
    for now in (10.0, 20.0, 30.0):
        started.update({d.job_id: d.placement.nodes for d in core.schedule(now)
                        if isinstance(d, Start)})
    assert started.get("in-big") == ("b",), started


def test_a_waiting_job_is_told_its_partition() -> None:
    core = SchedulingCore(make_policy("fifo"))
    core.node_up(replace(inventory("a", gpus=4, cpus=16), partitions=("small",)))
    core.node_up(replace(inventory("b", gpus=8, cpus=16), partitions=("big",)))
    core.submit(job("first", gpus=4, t=0, selector=NodeSelector(partitions=("small",))))
    core.schedule(1)
    core.submit(job("next", gpus=2, t=2, selector=NodeSelector(partitions=("small",))))
    core.schedule(3)
    assert WaitExplainer(core).why(core.jobs["next"]) == (
        "no_fit", "no node in partition small has 2 free GPUs now")
    assert core.unsatisfiable(job("x", selector=NodeSelector(partitions=("gone",))).spec) == (
        "no registered node is in partition gone")


CONFIG = [dataclasses.asdict(GPU), dataclasses.asdict(DEBUG)]


def submitted(**kw: Any) -> dict[str, Any]:
    return {"name": "j", "command": ["true"], "user": "alice", "kind": "training",
            "gpus": 1, "cpus": 1, **kw}


def run(tmp_path: Path, body: Any, **config: Any) -> None:
    through_rpc(tmp_path, lambda master, rpc, _: body(master, rpc),
                {"n1": (4, 8), "n2": (4, 8), "n3": (8, 8)}, **config)


def test_the_master_writes_partitions_into_jobs_and_refuses_what_none_admits(
        tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        first = (await as_(ALICE, lambda: call("submit", {"job": submitted()})))["job"]
        assert first["partition"] == "gpu" and first["time_limit_s"] == 3600
        several = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            selector={"partitions": ["debug", "gpu"]}, time_limit_s=3000)})))["job"]
        assert several["partition"] == "gpu"  # debug takes at most 30 min
        error = await refused(ALICE, lambda: call("submit", {"job": submitted(
            selector={"partitions": ["debug"]}, time_limit_s=3000)}))
        assert error.code == "invalid_partition"
        assert error.message == ("job j: partition 'debug' takes time limits up to 30min "
                                 "(this job asks 50min)")
        # n1 and n2 hold 4 GPUs each: 9 GPUs fit only with debug's n3 beside them.
        error = await refused(ALICE, lambda: call("submit", {"job": submitted(gpus=9)}))
        assert error.code == "unsatisfiable"
        assert error.message == ("job j: asks for 9 GPUs but the nodes it selects (in gpu) "
                                 "have 8")
        big = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            gpus=8, selector={"partitions": ["debug"]})})))["job"]
        assert big["time_limit_s"] == 1800
        master._run_pass()
        assert master.core.cluster.allocation(first["id"]).nodes[0] in ("n1", "n2")
        assert master.core.cluster.allocation(big["id"]).nodes == ("n3",)
        listing = {p["name"]: p for p in (await as_(ALICE, lambda: call("partitions", {})))[
            "partitions"]}
        assert (listing["gpu"]["node_count"], listing["gpu"]["gpus"],
                listing["gpu"]["running"]) == (2, 8, 2)
        assert (listing["debug"]["free_gpus"], listing["debug"]["default_time_s"]) == (0, 1800)
        text = show_partitions(list(listing.values()))
        assert text.splitlines()[1].split()[:6] == ["gpu*", "up", "2/2", "6/8", "2h", "1h"]

    run(tmp_path, body, partitions=CONFIG)


def test_without_partitions_a_named_one_is_refused(tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        error = await refused(ADMIN, lambda: rpc.call("submit", {"job": submitted(
            selector={"partitions": ["gpu"]})}))
        assert error.code == "invalid_partition" and "has no partitions" in error.message
        plain = (await as_(ADMIN, lambda: rpc.call("submit", {"job": submitted()})))["job"]
        assert plain["partition"] == "" and plain["time_limit_s"] is None
        assert (await as_(ADMIN, lambda: rpc.call("partitions", {})))["partitions"] == []

    run(tmp_path, body)


def test_sighup_relabels_nodes_and_keeps_a_partition_queued_jobs_need(
        tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        waiting = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            gpus=8, selector={"partitions": ["debug"]}, user="bob")})))["job"]
        await as_(ALICE, lambda: call("submit", {"job": submitted(
            gpus=8, selector={"partitions": ["debug"]})}))
        master._run_pass()  # the first starts on n3, the second waits for it
        assert master.core.jobs[waiting["id"]].state.value == "starting"
        # debug removed, gpu now also holds n3.
        master.config = replace(master.config, partitions=(replace(GPU, nodes="n[1-3]"),))
        master.events.config_changed.emit()
        assert master.core.cluster.node("n3").inventory.partitions == ("gpu", "debug")
        names = [p["name"] for p in (await as_(ALICE, lambda: call("partitions", {})))[
            "partitions"]]
        assert names == ["gpu", "debug"]  # kept: a queued job may run only there
        # Once nothing needs it, the next reload drops it.
        for queued in list(master.core.queue()):
            await as_(ADMIN, lambda q=queued: call("cancel", {"id": q.id}))
        master.config = replace(master.config, partitions=(replace(GPU, nodes="n[1-3]"),))
        master.events.config_changed.emit()
        assert master.core.cluster.node("n3").inventory.partitions == ("gpu",)

    run(tmp_path, body, partitions=CONFIG)


def test_partition_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    def jobs(*argv: str) -> list[dict[str, Any]]:
        args = build_parser().parse_args(["submit", "--user", "nobody", *argv])
        return jobs_from_args(args)[0]

    assert jobs("-p", "gpu,debug,gpu", "--", "true")[0]["selector"] == {
        "partitions": ["gpu", "debug"]}
    with pytest.raises(UsageError, match="--partition 'gpu,': give partition names"):
        jobs("--partition", "gpu,", "--", "true")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -p debug\ntrue\n")
    assert jobs(str(script))[0]["selector"] == {"partitions": ["debug"]}
    monkeypatch.setenv("SBATCH_PARTITION", "gpu")
    assert jobs(str(script))[0]["selector"] == {"partitions": ["gpu"]}
    assert show_partitions([]) == "this cluster has no partitions: jobs may use every node"


def test_a_held_job_keeps_its_removed_partition_too(tmp_path: Path) -> None:
    """A job a gate keeps out of the policy's queue (held here) is queued all the same: a
    reload that removes its only partition keeps that partition for it."""
    async def body(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        await as_(ALICE, lambda: call("submit", {"job": submitted(
            gpus=8, selector={"partitions": ["debug"]}, user="bob")}))
        held = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            gpus=8, selector={"partitions": ["debug"]})})))["job"]
        master._run_pass()  # the first starts on n3
        await as_(ALICE, lambda: call("hold", {"id": held["id"]}))
        assert held["id"] not in {j.id for j in master.core.queue()}  # gated
        master.config = replace(master.config, partitions=(GPU,))
        master.events.config_changed.emit()
        listing = {p["name"]: p for p in (await as_(ALICE, lambda: call("partitions", {})))[
            "partitions"]}
        assert set(listing) == {"gpu", "debug"} and listing["debug"]["queued"] == 1

    run(tmp_path, body, partitions=CONFIG)


def test_an_admin_sets_a_partitions_state_and_it_outlives_a_restart(tmp_path: Path) -> None:
    """down: jobs queue, nothing starts through it; drain: no new jobs, queued ones start;
    the state is journalled and a new master keeps it; bad names and states are refused."""
    async def first(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        for params, code in (({"name": "nope", "state": "down"}, "invalid_partition"),
                             ({"name": "debug", "state": "sideways"}, "invalid_params")):
            error = await refused(ADMIN, lambda p=params: call("partition_update", p))
            assert error.code == code, error
        assert "partition_update" not in CLIENT_METHODS  # an admin's only
        down = (await as_(ADMIN, lambda: call("partition_update", {
            "name": "debug", "state": "down", "reason": "fabric repair"})))["partition"]
        assert (down["state"], down["state_reason"], down["node_count"]) == (
            "down", "fabric repair", 1)
        assert master.core.cluster.node("n3").inventory.closed_partitions == ("debug",)
        # Down: the job is taken and waits; nothing starts on debug's node.
        queued = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            gpus=8, selector={"partitions": ["debug"]})})))["job"]
        master._run_pass()
        assert master.core.cluster.allocation(queued["id"]) is None
        shown = (await as_(ALICE, lambda: call("job", {"id": queued["id"]})))["job"]
        assert shown["reason"] == ("partition debug starts no job now (down or inactive); "
                                   "`trellisctl partitions` says why"), shown
        # Drain: no new job, the queued one starts.
        await as_(ADMIN, lambda: call("partition_update", {"name": "debug", "state": "drain"}))
        error = await refused(ALICE, lambda: call("submit", {"job": submitted(
            gpus=1, selector={"partitions": ["debug"]})}))
        assert error.message == "job j: partition 'debug' is drain: it takes no new jobs"
        master._run_pass()
        assert master.core.cluster.allocation(queued["id"]).nodes == ("n3",)
        await as_(ADMIN, lambda: call("partition_update", {"name": "gpu", "state": "inactive"}))

    run(tmp_path, first, partitions=CONFIG)

    async def second(master: Master, rpc: Rpc) -> None:
        listing = {p["name"]: p["state"] for p in (await as_(
            ALICE, lambda: rpc.call("partitions", {})))["partitions"]}
        assert listing == {"gpu": "inactive", "debug": "drain"}
        assert master.core.cluster.node("n1").inventory.closed_partitions == ("gpu",)
        error = await refused(ALICE, lambda: rpc.call("submit", {"job": submitted()}))
        assert "partition 'gpu' is inactive" in error.message

    run(tmp_path, second, partitions=CONFIG)


@pytest.mark.parametrize("name", ["fifo", "sjf", "drf"])
def test_a_higher_tier_partitions_job_queues_first_on_shared_nodes(name: str) -> None:
    """Slurm's PriorityTier: two partitions over one node; the job of the higher tier,
    submitted later, takes the node first. Classes come before tiers, priority after."""
    core = SchedulingCore(make_policy(name))
    core.node_up(replace(inventory("n1", gpus=4, cpus=16), partitions=("low", "high")))
    core.set_partition_tiers(PartitionTable.of([
        Partition("low", "n1", default=True), Partition("high", "n1", priority_tier=10),
    ]).tiers())
    common: dict[str, Any] = {"iterations": 1000, "batch": 64, "model_type": "resnet50"}
    for job_id, t, partition in (("early", 0.0, "low"), ("late", 1.0, "high")):
        made = job(job_id, gpus=4, t=t, **common)
        core.submit(replace(made, spec=replace(made.spec, selector=NodeSelector(
            partitions=(partition,)))))
    assert [j.id for j in core.queue()] == ["late", "early"]
    started = [d.job_id for d in core.schedule(2.0) if isinstance(d, Start)]
    assert started == ["late"]
    core.set_partition_tiers({})  # tiers gone: submission order again
    assert [j.id for j in core.queue()] == ["early"]


def test_the_master_installs_tiers_and_lists_them(tmp_path: Path) -> None:
    tiered = [dataclasses.asdict(replace(GPU, priority_tier=5)), dataclasses.asdict(DEBUG)]

    async def body(master: Master, rpc: Rpc) -> None:
        assert master.core.partition_tiers == {"gpu": 5}
        listing = {p["name"]: p["priority_tier"] for p in (await as_(
            ALICE, lambda: rpc.call("partitions", {})))["partitions"]}
        assert listing == {"gpu": 5, "debug": 0}

    run(tmp_path, body, partitions=tiered)
