"""The core tuner (noded.tuner) against modelled GPU-utilisation curves over 1..32 cores."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from noded.policy.tuner import CoreTuner, ProbePlan, TunerError

Curve = Callable[[int], float]


def knee_curve(knee: int, u_max: float = 80.0, alpha: float = 1.0, decline: float = 0.0) -> Curve:
    """Utilisation rises as (c/knee)^alpha up to the knee, then holds or drops slightly."""

    def util(cores: int) -> float:
        if cores <= knee:
            return u_max * (cores / knee) ** alpha
        return u_max - decline * (cores - knee)

    return util


def true_best_fit(curve: Curve, tolerance: float, max_cores: int = 32) -> int:
    values = [curve(c) for c in range(1, max_cores + 1)]
    return next(c for c, u in enumerate(values, 1) if u >= max(values) - tolerance)


def run(tuner: CoreTuner, curve: Curve, rng: random.Random | None = None,
        sigma: float = 0.0) -> CoreTuner:
    guard = 0
    while (cores := tuner.next_count()) is not None:
        noise = rng.gauss(0.0, sigma) if rng else 0.0
        tuner.observe(cores, min(100.0, max(0.0, curve(cores) + noise)))
        guard += 1
        assert guard < 500, "tuner did not converge"
    return tuner


# -- noiseless curves: the search itself --------------------------------------------------------


@pytest.mark.parametrize("n_start", [2, 3, 4, 5, 6])
def test_cold_start_finds_every_knee_in_at_most_five_steps(n_start: int) -> None:
    for knee in range(1, 33):
        curve = knee_curve(knee)
        tuner = run(CoreTuner(n_start, max_cores=32, noise=0.0), curve)
        assert tuner.converged
        assert tuner.best == knee == true_best_fit(curve, 2.0)
        assert tuner.steps <= 5, (knee, tuner.history)


def test_warm_start_finds_best_fit_within_window_in_at_most_four_steps() -> None:
    worst = 0
    for n_start in range(1, 33):
        plan = ProbePlan(1, 32, (max(1, n_start - 3), min(32, n_start + 3)), window_first=True)
        for offset in range(-3, 4):
            knee = n_start + offset
            if not 1 <= knee <= 32:
                continue
            tuner = CoreTuner(n_start, max_cores=32, noise=0.0, warm=True, plan=plan)
            run(tuner, knee_curve(knee))
            assert tuner.best == knee
            assert tuner.steps <= 4, (n_start, knee, tuner.history)
            worst = max(worst, tuner.steps)
    # The paper reports 3-4 probing steps; the plan needs 4 in the middle of the range.
    assert worst == 4


def test_warm_start_still_finds_a_best_fit_far_outside_its_window() -> None:
    for knee in (1, 2, 20, 32):
        tuner = run(CoreTuner(10, max_cores=32, noise=0.0, warm=True), knee_curve(knee))
        assert tuner.best == knee
        assert tuner.steps > 3  # leaving the window costs extra probes


def test_slight_decline_after_knee_and_steep_rise() -> None:
    curve = knee_curve(12, u_max=90.0, alpha=2.0, decline=0.03)
    tuner = run(CoreTuner(5, max_cores=32, noise=0.0), curve)
    assert tuner.best == 12 == true_best_fit(curve, 2.0)


def test_best_fit_is_below_knee_when_last_rise_is_within_tolerance() -> None:
    # Knee at 32 with a linear rise of 60/32 = 1.875 points per core: 31 is within 2 points.
    curve = knee_curve(32, u_max=60.0)
    assert true_best_fit(curve, 2.0) == 31
    assert run(CoreTuner(5, max_cores=32, noise=0.0), curve).best == 31


def test_flat_curve_converges_to_min_cores() -> None:
    tuner = run(CoreTuner(5, max_cores=16, min_cores=2, noise=0.0), lambda c: 70.0)
    assert tuner.best == 2


# -- noisy curves ---------------------------------------------------------------------------


def _noisy_jobs(warm: bool, count: int, seed: int) -> list[tuple[int, Curve, int]]:
    rng = random.Random(seed)
    jobs = []
    for _ in range(count):
        knee = rng.randint(1, 32)
        curve = knee_curve(knee, rng.uniform(60, 95), rng.uniform(1.0, 2.0),
                           rng.uniform(0.0, 0.03))
        best = true_best_fit(curve, 2.0)
        n_start = min(32, max(1, best + rng.randint(-3, 3))) if warm else rng.randint(2, 6)
        jobs.append((n_start, curve, best))
    return jobs


@pytest.mark.parametrize("warm", [True, False])
def test_noisy_measurements_keep_step_bounds_and_find_exact_best_fit(warm: bool) -> None:
    rng = random.Random(7)
    exact, steps = 0, []
    plans: dict[int, ProbePlan] = {}  # one plan per start point, as noded would cache them
    jobs = _noisy_jobs(warm, 250, seed=11 if warm else 12)
    for n_start, curve, best in jobs:
        window = (max(1, n_start - 3), min(32, n_start + 3))
        plan = plans.setdefault(n_start, ProbePlan(1, 32, window, window_first=warm))
        tuner = CoreTuner(n_start, max_cores=32, noise=1.0, warm=warm, plan=plan)
        run(tuner, curve, rng, 1.0)
        exact += tuner.best == best
        steps.append(tuner.steps)
        # Extra windows go to the same count: windows beyond steps are never re-pins.
        repins = sum(1 for a, b in itertools.pairwise(tuner.history) if a[0] != b[0])
        assert repins == tuner.steps
    assert max(steps) <= (4 if warm else 6)
    assert exact / len(jobs) >= 0.95


def test_ambiguous_count_is_measured_again_without_a_repin() -> None:
    tuner = CoreTuner(8, max_cores=16, noise=1.0, reference_windows=2, max_windows=4)
    for _ in range(2):
        tuner.observe(16, 80.0)
    probe = tuner.next_count()
    assert probe is not None and probe != 16
    tuner.observe(probe, 78.1)  # 0.1 above the threshold of 78: too close to call
    assert tuner.next_count() == probe
    assert tuner.steps == 1


def test_noiseless_tuner_never_repeats_a_count() -> None:
    tuner = run(CoreTuner(5, max_cores=32, noise=0.0), knee_curve(9))
    counts = [c for c, _ in tuner.history]
    assert counts.count(32) == tuner.reference_windows
    assert len(counts) - tuner.reference_windows == tuner.steps


# -- protocol -------------------------------------------------------------------------------


def test_reference_is_measured_first_and_history_is_recorded() -> None:
    tuner = CoreTuner(4, max_cores=24, noise=0.0, reference_windows=2)
    assert tuner.next_count() == 24
    assert tuner.best is None and tuner.reference is None
    tuner.observe(24, 70.0)
    assert tuner.next_count() == 24 and tuner.steps == 0
    tuner.observe(24, 72.0)
    assert tuner.reference == pytest.approx(71.0)
    assert tuner.best == 24
    probe = tuner.next_count()
    assert probe is not None and 1 <= probe < 24
    tuner.observe(probe, 71.0)
    assert tuner.steps == 1
    assert tuner.history == [(24, 70.0), (24, 72.0), (probe, 71.0)]


def test_launch_at_n_start_costs_one_step_to_reach_the_reference() -> None:
    tuner = CoreTuner(5, max_cores=32, noise=0.0, launch_cores=5, reference_windows=2)
    assert tuner.next_count() == 5
    tuner.observe(5, 40.0)
    tuner.observe(5, 40.0)  # the launch count gets the same free windows as the reference
    assert tuner.next_count() == 32
    run(tuner, knee_curve(12))
    assert tuner.best == 12
    assert tuner.history[2][0] == 32
    assert tuner.steps <= 6


def test_observation_for_another_count_is_rejected() -> None:
    tuner = CoreTuner(4, max_cores=8)
    with pytest.raises(TunerError, match="asked for 8"):
        tuner.observe(4, 50.0)


@pytest.mark.parametrize("bad", [-1.0, 100.5, math.nan, math.inf, True, "80"])
def test_bad_utilisation_is_rejected(bad: object) -> None:
    tuner = CoreTuner(4, max_cores=8)
    with pytest.raises(TunerError, match="utilisation"):
        tuner.observe(8, bad)  # type: ignore[arg-type]


def test_observing_after_convergence_is_an_error() -> None:
    tuner = run(CoreTuner(2, max_cores=4, noise=0.0), knee_curve(2))
    assert tuner.next_count() is None
    with pytest.raises(TunerError, match="converged"):
        tuner.observe(2, 50.0)


def test_single_possible_count_converges_without_measuring() -> None:
    tuner = CoreTuner(3, min_cores=3, max_cores=3)
    assert tuner.converged and tuner.best == 3 and tuner.next_count() is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_cores": 0}, "min_cores"),
        ({"max_cores": 4, "min_cores": 5}, "min_cores"),
        ({"max_cores": 8, "tolerance": 0}, "tolerance"),
        ({"max_cores": 8, "noise": -1}, "noise"),
        ({"max_cores": 8, "launch_cores": 9}, "launch_cores"),
        ({"max_cores": 8, "max_windows": 0}, "max_windows"),
        ({"max_cores": 8, "confidence_z": math.nan}, "confidence_z"),
        ({"max_cores": 8.5}, "integer"),
    ],
)
def test_bad_parameters_are_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TunerError, match=match):
        CoreTuner(4, **kwargs)  # type: ignore[arg-type]


def test_n_start_outside_bounds_is_clamped() -> None:
    assert CoreTuner(40, max_cores=16).n_start == 16
    assert CoreTuner(0, max_cores=16, min_cores=2).n_start == 2


def test_shared_plan_must_match() -> None:
    plan = ProbePlan(1, 32, (2, 8), window_first=True)
    CoreTuner(5, max_cores=32, warm=True, plan=plan)
    with pytest.raises(TunerError, match="shared plan"):
        CoreTuner(5, max_cores=32, warm=False, plan=plan)


# -- the probe plan -------------------------------------------------------------------------


@pytest.mark.parametrize("counts", [2, 3, 7, 8, 9, 24, 32, 33, 64])
def test_cold_plan_is_minimax(counts: int) -> None:
    plan = ProbePlan(1, counts, (2, 6), window_first=False)
    assert plan.worst_case(0, counts)[1] == math.ceil(math.log2(counts))


def test_plan_probes_lie_inside_the_bracket() -> None:
    plan = ProbePlan(3, 20, (6, 12), window_first=True)
    for lo in range(2, 19):
        for hi in range(lo + 2, 21):
            assert lo < plan.probe(lo, hi) < hi
    with pytest.raises(TunerError, match="nothing to probe"):
        plan.probe(4, 5)
    with pytest.raises(TunerError, match="outside"):
        plan.probe(0, 10)
