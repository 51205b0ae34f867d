"""The contention controller against scripted observations (no clock, no kernel)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noded.policy.contention import (
    ContentionController,
    Decision,
    JobSample,
    Observation,
    mba_levels,
)
from rdt.schemata import round_mb_percent
from shared.config import ConfigError, ContentionConfig, NodeConfig, load_config

GIB = float(1 << 30)
PEAK = 10 * GIB
LEVELS = mba_levels(20, 10)  # 100, 80, 60, 40, 20, 10


def controller(levels: tuple[int, ...] = LEVELS, **overrides: object) -> ContentionController:
    config = ContentionConfig(**{"restore_intervals": 3, **overrides})  # type: ignore[arg-type]
    return ContentionController(config, peak_bps=PEAK, levels=levels)


def cpu(job: str = "c1", bw: float | None = None, cpus: tuple[int, ...] = (0, 1, 2, 3),
        mba: bool = True, kind: str = "cpu") -> JobSample:
    return JobSample(job, kind, cpus, bandwidth_bps=bw, mba=mba)


def train(job: str = "t1", util: float | None = 95.0) -> JobSample:
    return JobSample(job, "training", (4, 5), gpus=1, gpu_util=util)


def at(ctl: ContentionController, pressure: float | None, *jobs: JobSample,
       t: float = 0.0) -> list[Decision]:
    node = None if pressure is None else pressure * PEAK
    return ctl.observe(Observation(t, jobs or (cpu(),), mbm=True, node_bandwidth_bps=node))


def actions(ds: list[Decision]) -> list[tuple[str, str, int]]:
    return [(d.job_id, d.action, d.value) for d in ds]


# ---------------------------------------------------------------------------------------------
# MBM: throttle, cores, restore


def test_levels_follow_kernel_rounding() -> None:
    def kernel(v: int) -> int:
        return round_mb_percent(v, min_bandwidth=10, bandwidth_gran=10)

    assert LEVELS == (100, 80, 60, 40, 20, 10)
    assert mba_levels(25, 10, kernel) == (100, 80, 50, 30, 10)
    # A granularity coarser than the step merges levels instead of repeating them.
    assert mba_levels(10, 10, lambda v: round_mb_percent(v, min_bandwidth=25,
                                                         bandwidth_gran=25)) == (100, 75, 50, 25)
    with pytest.raises(ValueError, match="mba_step"):
        mba_levels(0, 10)
    with pytest.raises(ValueError, match="strictly"):
        ContentionController(ContentionConfig(), levels=(80, 100))


def test_crossing_the_threshold_steps_mba_down_then_halves_cores() -> None:
    ctl = controller()
    assert at(ctl, 0.50) == []
    assert at(ctl, 0.74) == []
    steps = [actions(at(ctl, 0.80)) for _ in range(8)]
    assert steps == [
        [("c1", "mba", 80)], [("c1", "mba", 60)], [("c1", "mba", 40)], [("c1", "mba", 20)],
        [("c1", "mba", 10)],
        [("c1", "cores", 2)], [("c1", "cores", 1)],
        [],  # MBA at its floor and one core left: nothing more to take
    ]
    assert ctl.throttled() == {"c1": (10, 1)}


def test_threshold_is_inclusive_and_reason_says_why() -> None:
    ctl = controller()
    [d] = at(ctl, 0.75)
    assert (d.action, d.value, d.previous) == ("mba", 80, 100)
    assert "pressure=0.75>=0.75" in d.reason and "peak_mibps=10240" in d.reason
    assert "node_mibps=7680" in d.reason


def test_without_mba_cores_are_halved_never_below_one() -> None:
    ctl = controller(levels=())
    job = cpu(cpus=(0, 1, 2, 3, 4, 5, 6, 7), mba=False)
    got = [at(ctl, 0.9, job) for _ in range(5)]
    assert [actions(d) for d in got] == [
        [("c1", "cores", 4)], [("c1", "cores", 2)], [("c1", "cores", 1)], [], []]
    assert got[0][0].cpus == (0, 1, 2, 3) and got[2][0].cpus == (0,)
    assert "mba=absent" in got[0][0].reason


def test_odd_core_counts_round_down_but_restore_to_the_allocation() -> None:
    ctl = controller(levels=())
    job = cpu(cpus=(3, 5, 7), mba=False)
    assert actions(at(ctl, 0.9, job)) == [("c1", "cores", 1)]
    for _ in range(2):
        assert at(ctl, 0.1, job) == []
    [d] = at(ctl, 0.1, job)
    assert (d.action, d.value, d.cpus) == ("restore_cores", 2, (3, 5))
    for _ in range(2):
        at(ctl, 0.1, job)
    [d] = at(ctl, 0.1, job)
    assert (d.action, d.value, d.cpus) == ("restore_cores", 3, (3, 5, 7))
    assert ctl.throttled() == {}


def test_a_job_without_a_control_group_gets_cores_halved_even_with_mba() -> None:
    ctl = controller()
    assert actions(at(ctl, 0.9, cpu(mba=False))) == [("c1", "cores", 2)]


def test_heaviest_jobs_covering_the_excess_are_throttled_first() -> None:
    ctl = controller()
    heavy = cpu("heavy", bw=3 * GIB)
    light = cpu("light", bw=0.1 * GIB)
    middle = cpu("middle", bw=1 * GIB)
    # excess over 75 % of 10 GiB at 80 %: 0.5 GiB, covered by the heaviest alone
    assert actions(at(ctl, 0.80, light, heavy, middle)) == [("heavy", "mba", 80)]
    # excess 3.5 GiB: heavy (3) then middle (1)
    assert actions(at(ctl, 1.10, light, heavy, middle)) == [
        ("heavy", "mba", 60), ("middle", "mba", 80)]
    # unknown bandwidth cannot be ruled out: such a job is always throttled
    unknown = cpu("unknown", bw=None)
    assert {d.job_id for d in at(ctl, 0.80, heavy, unknown)} == {"heavy", "unknown"}


def test_jobs_at_their_floor_are_skipped_for_the_next_heaviest() -> None:
    ctl = controller(levels=())
    heavy = cpu("heavy", bw=5 * GIB, cpus=(0,), mba=False)
    other = cpu("other", bw=1 * GIB, cpus=(1, 2), mba=False)
    assert actions(at(ctl, 0.8, heavy, other)) == [("other", "cores", 1)]


def test_gpu_jobs_and_other_kinds_are_never_throttled() -> None:
    ctl = controller()
    infer = cpu("infer", bw=5 * GIB, kind="inference")
    training = JobSample("t1", "training", (0, 1), gpus=2, bandwidth_bps=5 * GIB)
    assert at(ctl, 0.95, infer, training) == []
    ctl = controller(throttle_kinds=("cpu", "inference"))
    assert actions(at(ctl, 0.95, infer, training)) == [("infer", "mba", 80)]


def test_hysteresis_restores_step_by_step() -> None:
    ctl = controller()
    at(ctl, 0.9)
    at(ctl, 0.9)
    assert ctl.throttled() == {"c1": (60, None)}
    got = [actions(at(ctl, 0.30)) for _ in range(7)]
    assert got == [[], [], [("c1", "restore_mba", 80)], [], [], [("c1", "restore_mba", 100)], []]
    assert ctl.throttled() == {}


def test_restore_undoes_cores_before_mba() -> None:
    ctl = controller(levels=(100, 50))
    job = cpu(cpus=(0, 1, 2, 3))
    assert [actions(at(ctl, 0.9, job)) for _ in range(3)] == [
        [("c1", "mba", 50)], [("c1", "cores", 2)], [("c1", "cores", 1)]]
    restored = []
    for _ in range(9):
        restored += actions(at(ctl, 0.1, job))
    assert restored == [("c1", "restore_cores", 2), ("c1", "restore_cores", 4),
                        ("c1", "restore_mba", 100)]


def test_no_flapping_at_the_boundary() -> None:
    ctl = controller()
    seen: list[str] = []
    for i in range(20):
        seen += [d.action for d in at(ctl, 0.76 if i % 2 else 0.74)]
    assert seen == ["mba"] * 5 + ["cores"] * 2  # only ever throttles, down to the floor
    ctl = controller()
    at(ctl, 0.8)
    # Inside the band, or briefly below it, never restores: the calm count starts again.
    for pressure in (0.7, 0.59, 0.59, 0.61, 0.59, 0.59, 0.65, 0.59, 0.59):
        assert at(ctl, pressure) == []
    assert actions(at(ctl, 0.59)) == [("c1", "restore_mba", 100)]


def test_an_unreadable_interval_neither_throttles_nor_counts_as_calm() -> None:
    ctl = controller()
    assert at(ctl, None) == []  # even a node far over the threshold would not show here
    at(ctl, 0.9)
    for p in (0.1, 0.1, None):  # the gap holds the calm count where it was ...
        assert at(ctl, p) == []
    # ... so the third calm interval restores
    assert actions(at(ctl, 0.1)) == [("c1", "restore_mba", 100)]


def test_unknown_peak_means_no_decisions() -> None:
    ctl = ContentionController(ContentionConfig(), peak_bps=None, levels=LEVELS)
    assert at(ctl, 5.0) == []


def test_a_job_that_leaves_is_forgotten() -> None:
    ctl = controller()
    at(ctl, 0.9, cpu("a"))
    assert "a" in ctl.throttled()
    at(ctl, 0.5, cpu("b"))
    assert ctl.throttled() == {}
    # back again (a re-run with the same id): starts from 100 %
    assert actions(at(ctl, 0.9, cpu("a"))) == [("a", "mba", 80)]


def test_revert_puts_state_back() -> None:
    ctl = controller()
    [d] = at(ctl, 0.9)
    ctl.revert(d)
    assert ctl.throttled() == {}
    assert actions(at(ctl, 0.9)) == [("c1", "mba", 80)]
    ctl = controller(levels=())
    [d] = at(ctl, 0.9, cpu(mba=False))
    ctl.revert(d)
    assert ctl.throttled() == {}
    [d] = at(ctl, 0.9, cpu(mba=False))
    assert d.value == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.2), min_size=1, max_size=80))
def test_property_restores_only_after_a_calm_run(pressures: list[float]) -> None:
    ctl = controller()
    calm = 0
    for p in pressures:
        decisions = at(ctl, p)
        calm = calm + 1 if p < 0.60 else 0
        for d in decisions:
            if d.action.startswith("restore"):
                assert calm >= 3 and p < 0.60
            else:
                assert p >= 0.75
        level = ctl.throttled().get("c1", (100, None))
        assert level[0] in LEVELS and (level[1] is None or level[1] >= 1)


# ---------------------------------------------------------------------------------------------
# Without MBM: GPU utilisation


def gpu_at(ctl: ContentionController, util: float, *jobs: JobSample) -> list[Decision]:
    return ctl.observe(Observation(0.0, (train(util=util), *(jobs or (cpu(),))), mbm=False))


def test_gpu_drop_with_cpu_jobs_is_contention() -> None:
    ctl = controller(gpu_warmup_intervals=5, gpu_drop_intervals=3, gpu_drop_points=15,
                     gpu_settle_intervals=2)
    for _ in range(6):
        assert gpu_at(ctl, 95) == []
    assert gpu_at(ctl, 85) == []  # a 10-point dip is noise
    assert gpu_at(ctl, 70) == []
    assert gpu_at(ctl, 70) == []
    [d] = gpu_at(ctl, 70)
    assert (d.action, d.value) == ("mba", 80)
    assert "victim=t1" in d.reason and "stable=95" in d.reason and "drop=25>15" in d.reason
    # settling: the next two intervals wait for utilisation to answer
    assert gpu_at(ctl, 70) == [] and gpu_at(ctl, 70) == []
    assert actions(gpu_at(ctl, 70)) == [("c1", "mba", 60)]


def test_gpu_drop_without_cpu_jobs_or_during_warmup_is_not_contention() -> None:
    ctl = controller(gpu_warmup_intervals=5, gpu_drop_intervals=2)
    for util in (95, 30, 30, 30, 30):  # warm-up: no stable level yet
        assert gpu_at(ctl, util) == []
    ctl = controller(gpu_warmup_intervals=2, gpu_drop_intervals=2)
    for util in (95, 95, 40, 40, 40):  # no CPU job to blame
        assert ctl.observe(Observation(0.0, (train(util=util),), mbm=False)) == []
    # a CPU job arrives: the drop must persist gpu_drop_intervals from now on
    assert gpu_at(ctl, 40) == []
    assert actions(gpu_at(ctl, 40)) == [("c1", "mba", 80)]


def test_gpu_method_restores_by_probing_and_backs_off_when_contention_returns() -> None:
    ctl = controller(gpu_warmup_intervals=2, gpu_drop_intervals=1, gpu_settle_intervals=0,
                     restore_intervals=2, gpu_stable_window=50)
    for _ in range(3):
        gpu_at(ctl, 90)
    assert actions(gpu_at(ctl, 50)) == [("c1", "mba", 80)]
    assert gpu_at(ctl, 90) == []  # recovered: calm 1
    assert actions(gpu_at(ctl, 90)) == [("c1", "restore_mba", 100)]  # calm 2: probe
    # contention is back after the probe: throttle again, and wait twice as long next time
    assert actions(gpu_at(ctl, 50)) == [("c1", "mba", 80)]
    for _ in range(3):
        assert gpu_at(ctl, 90) == []
    assert actions(gpu_at(ctl, 90)) == [("c1", "restore_mba", 100)]
    assert ctl.throttled() == {}


def test_gpu_method_restores_when_the_training_job_leaves() -> None:
    ctl = controller(gpu_warmup_intervals=2, gpu_drop_intervals=1, restore_intervals=2)
    for _ in range(3):
        gpu_at(ctl, 90)
    assert actions(gpu_at(ctl, 40)) == [("c1", "mba", 80)]
    alone = Observation(0.0, (cpu(),), mbm=False)
    assert ctl.observe(alone) == []
    assert actions(ctl.observe(alone)) == [("c1", "restore_mba", 100)]


# ---------------------------------------------------------------------------------------------
# Configuration


def test_config_rejects_inverted_thresholds_and_unknown_kinds(tmp_path: Path) -> None:
    path = tmp_path / "n.toml"
    path.write_text('[node]\nname = "n1"\n[contention]\nthreshold = 0.5\n'
                    "restore_threshold = 0.6\n")
    with pytest.raises(ConfigError, match="restore_threshold"):
        load_config(NodeConfig, path, "node")
    path.write_text('[node]\nname = "n1"\n[contention]\nthrottle_kinds = ["training"]\n')
    with pytest.raises(ConfigError, match="throttle_kinds"):
        load_config(NodeConfig, path, "node")
    path.write_text('[node]\nname = "n1"\n[rdt]\nmode = "magic"\n')
    with pytest.raises(ConfigError, match=r"rdt\.mode"):
        load_config(NodeConfig, path, "node")
    path.write_text('[node]\nname = "n1"\n[rdt]\nmode = "emulated"\nemulated_profile = "no_mb"\n'
                    "[contention]\ninterval_s = 0.5\npeak_bandwidth_mbps = 20000\n")
    cfg = load_config(NodeConfig, path, "node")
    assert cfg.rdt.mode == "emulated" and cfg.rdt.emulated_profile == "no_mb"
    assert cfg.contention.interval_s == 0.5 and cfg.contention.peak_bandwidth_mbps == 20000
