"""The EASY backfill study (sim/studies/backfill.py) on a small slice of the Philly trace:
limits drawn as documented (seeded, duration × U(1.2, 3), at least a minute), every variant
replayed per VC, nobody reaching a limit the recorded run stays under."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sim.studies.backfill import (
    LIMIT_FACTOR,
    MIN_LIMIT_S,
    BackfillStudy,
    load,
    run,
    time_limit,
)

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
needs_trace = pytest.mark.skipif(not (TRACES / "philly-jobs.csv").exists(),
                                 reason=f"the Philly trace is not at {TRACES}")


def test_limits_are_a_seeded_multiple_of_the_duration() -> None:
    for duration in (10.0, 100.0, 3600.0, 86400.0 * 5):
        limit = time_limit(duration, 1, "philly-000001")
        assert limit == time_limit(duration, 1, "philly-000001")  # seeded
        assert limit >= MIN_LIMIT_S
        if duration * LIMIT_FACTOR[0] >= MIN_LIMIT_S:
            assert duration * LIMIT_FACTOR[0] <= limit <= math.ceil(duration * LIMIT_FACTOR[1])
    draws = {time_limit(1000.0, 1, f"philly-{i:06d}") for i in range(200)}
    assert len(draws) > 150  # per job, not one factor for all
    assert time_limit(1000.0, 2, "philly-000001") != time_limit(1000.0, 1, "philly-000001")


@needs_trace
def test_a_slice_replays_every_variant() -> None:
    study = BackfillStudy(limit=400)
    workload = load(study, TRACES)
    assert all(j.spec.time_limit_s is not None and j.truth.known_duration is not None
               and j.spec.time_limit_s >= min(j.truth.known_duration * 1.2, MIN_LIMIT_S)
               for j in workload.jobs)
    out = run(study, TRACES)
    assert set(out["runs"]) == {"strict", "plain", "easy"}
    assert 1.2 <= out["setup"]["mean_limit_over_duration"] <= 3.0 + 1
    for variant, st in out["runs"].items():
        assert st["jobs"] == 400 and st["timeout"] == 0 and st["unfinished"] == 0, variant
        assert st["head_jobs"] > 0 and st["head_wait_max_s"] >= st["at_head_max_s"] >= 0
    # The same jobs end under every rule; only when they start differs.
    assert len({st["finished"] for st in out["runs"].values()}) == 1
