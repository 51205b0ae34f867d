"""Why a queued job waits (masterd.core.waiting), under several policies: every queued job gets
one reason of the shared vocabulary with a sentence."""

from __future__ import annotations

from masterd.core.genie.modeldb import ModelDB
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policies.swaf import SwafPolicy
from masterd.core.scheduler import SchedulingCore
from masterd.core.waiting import WaitExplainer
from shared.model import JobState, QosClass, WaitReason
from tests.unit.arrays_fixtures import gpu_node
from tests.unit.arrays_fixtures import job as array_job
from tests.unit.genie_support import job as genie_job
from tests.unit.helpers import inventory, job
from tests.unit.test_arrays_policy import policy as arrays_policy


def reasons(core: SchedulingCore) -> dict[str, tuple[str, str]]:
    waits = WaitExplainer(core)
    return {j.id: waits.why(j) for j in core.jobs.values() if j.state is JobState.QUEUED}


def test_fifo_gates_no_fit_and_priority() -> None:
    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("n1", gpus=4, cpus=8))
    core.submit(job("run", gpus=3, t=0))
    core.schedule(1)
    core.submit(job("big", gpus=2, t=2))  # 1 GPU free: it does not fit
    core.submit(job("small", gpus=1, t=3))  # fits, but FIFO keeps it behind big
    core.submit(job("held", gpus=1, t=4))
    core.set_gate("held", WaitReason.HELD, "held by its user")
    core.schedule(5)
    got = reasons(core)
    assert got["big"] == ("no_fit", "no node has 2 free GPUs now")
    assert got["small"] == ("priority", "behind 1 job the policy orders first")
    assert got["held"] == ("held", "held by its user")
    assert set(got) == {"big", "small", "held"}
    # A job the next pass will start: first in line.
    core.cancel("big", 6)
    assert reasons(core)["small"] == ("priority", "first in the policy's order; the next "
                                                  "scheduling pass starts it")
    # Running jobs have no wait reason.
    assert WaitExplainer(core).why(core.jobs["run"]) == ("", "")


def test_cores_and_models_in_the_no_fit_sentence() -> None:
    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("n1", gpus=0, cpus=4))
    core.submit(job("c", gpus=0, cpus=3, t=0))
    core.schedule(1)
    core.submit(job("c2", gpus=0, cpus=2, t=2))
    assert reasons(core)["c2"] == ("no_fit", "no node has 2 free cores now")


def test_easy_backfills_reservation_explains_the_head_and_the_jobs_held_for_it() -> None:
    core = SchedulingCore(FifoPolicy(backfill="easy"))
    core.node_up(inventory("n1", gpus=5, cpus=8))
    core.submit(job("run", gpus=3, t=0, time_limit_s=3600))
    core.schedule(1)
    core.submit(job("head", gpus=5, t=2, time_limit_s=600))
    core.submit(job("long", gpus=1, t=3))  # no limit: would outlast the reservation
    core.submit(job("short", gpus=1, t=4, time_limit_s=60))  # ends before it: backfills
    core.submit(job("wide", gpus=2, t=5, time_limit_s=60))
    started = {d.job_id for d in core.schedule(5)}
    assert started == {"short"}
    got = reasons(core)
    assert got["head"][0] == "reserved"
    assert got["head"][1].startswith("resources reserved for it from ") and "on n1" in \
        got["head"][1]
    assert got["long"][0] == "reserved"
    assert "job head's reservation begins" in got["long"][1]
    assert got["wide"][0] == "no_fit"


def test_a_reservation_behind_a_job_without_a_limit_says_so() -> None:
    core = SchedulingCore(FifoPolicy(backfill="easy"))
    core.node_up(inventory("n1", gpus=4, cpus=8))
    core.submit(job("endless", gpus=3, t=0))
    core.schedule(1)
    core.submit(job("head", gpus=4, t=2, time_limit_s=600))
    core.schedule(3)
    assert reasons(core)["head"] == (
        "reserved", "resources reserved for it once a running job without a time limit ends "
        "on n1")


def test_soda_arrays_notes_are_the_policys_reason() -> None:
    pol = arrays_policy()
    core = SchedulingCore(pol)
    for inv in (gpu_node("n1"), gpu_node("n2")):
        core.node_up(inv)
    core.submit(array_job(gpus=4, cpus=1, job_id="l1"))
    for i in range(8):
        core.submit(array_job(gpus=1, cpus=1, job_id=f"s{i}"))
    core.schedule(1.0)
    core.submit(array_job(gpus=8, cpus=1, submit=2.0, job_id="l2"))
    core.submit(array_job(gpus=1, cpus=1, submit=3.0, job_id="s8"))
    core.schedule(3.0)
    got = reasons(core)
    assert got["s8"] == ("policy", "waiting: small:A100 is full")
    assert got["l2"][0] in ("policy", "no_fit")
    for code, sentence in got.values():
        assert code in {r.value for r in WaitReason} and sentence


def test_swaf_orders_by_its_own_waiting_allowance() -> None:
    core = SchedulingCore(SwafPolicy(ModelDB.default()))
    core.node_up(inventory("n1", gpus=1, cpus=8, model="K80"))
    core.submit(genie_job("run", gpus=1, submit=0.0, iterations=100_000))
    core.schedule(1.0)
    core.submit(genie_job("normal", gpus=1, qos=QosClass.NORMAL, submit=2.0, iterations=500))
    core.submit(genie_job("prior", gpus=1, qos=QosClass.PRIOR, submit=3.0, iterations=500))
    core.schedule(4.0)
    got = reasons(core)
    # The GPU is busy, so neither fits now; with one free, SWAF's order decides.
    assert got["normal"][0] == "no_fit" and got["prior"][0] == "no_fit"
    core.node_up(inventory("n2", gpus=2, cpus=8, model="K80"))
    core.node_down("n2")  # known, not schedulable: the pass sees no room
    core.schedule(5.0)
    explainer = WaitExplainer(core)
    order = [c.job_id for c in core.policy.waiting_order()]  # type: ignore[attr-defined]
    assert order == ["prior", "normal"]
    assert explainer._position("prior") == 0 and explainer._position("normal") == 1
