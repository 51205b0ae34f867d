"""Array sizes re-derived from recent demand, within configured bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masterd.core.arrays import (
    ArrayConfig,
    ArrayId,
    DemandRecord,
    ModelArrays,
    Size,
    build_array_map,
    demand_of,
    resize,
)
from masterd.core.arrays.resize import DAY
from masterd.core.cluster import ClusterState
from shared.model import JobState, NodeAllocation, Placement
from tests.unit.arrays_fixtures import gpu_node, job

NOW = 100 * DAY


def rec(kind: str, gpu_s: float = 0.0, core_s: float = 0.0, age_days: float = 1.0,
        model: str | None = "A100") -> DemandRecord:
    return DemandRecord(NOW - age_days * DAY, kind, model if kind != "cpu" else None,
                        gpu_s, core_s)


def test_large_share_follows_large_gpu_seconds() -> None:
    config = ArrayConfig()
    out = resize(config, [rec("large", 300), rec("small", 100)], NOW)
    assert out.for_model("A100").large == Size.share(0.75)
    # Models without demand and without an entry keep the default.
    assert out.for_model("V100").large == config.default.large


def test_new_shares_are_clamped_to_fraction_bounds() -> None:
    config = ArrayConfig(default=ModelArrays(large_min=Size.share(0.2),
                                             large_max=Size.share(0.6)))
    assert resize(config, [rec("large", 100)], NOW).for_model("A100").large == Size.share(0.6)
    assert resize(config, [rec("small", 100)], NOW).for_model("A100").large == Size.share(0.2)


def test_only_the_window_counts_and_no_demand_keeps_sizes() -> None:
    config = ArrayConfig(history_days=7)
    old = [rec("large", 1000, age_days=8), rec("cpu", core_s=1000, age_days=30)]
    assert resize(config, old, NOW) == config
    assert resize(config, [], NOW) == config
    # Records from the future (clock skew) are ignored too.
    assert resize(config, [rec("large", 10, age_days=-1)], NOW) == config


def test_cpu_job_core_share_follows_core_seconds() -> None:
    out = resize(ArrayConfig(), [rec("small", 10, core_s=300), rec("cpu", core_s=100)], NOW)
    assert out.default.cpu_job_cores == Size.share(0.25)
    assert out.for_model("A100").cpu_job_cores == Size.share(0.25)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown array kind 'huge'"):
        resize(ArrayConfig(), [DemandRecord(NOW, "huge", None, 1, 1)], NOW)


def test_demand_of_a_finished_job() -> None:
    j = job(gpus=2, cpus=4, model="A100")
    assert demand_of(j) is None
    j.placement = Placement((NodeAllocation("n", (0, 1), (0, 1, 2, 3)),))
    j.start_time, j.end_time, j.state = 10.0, 110.0, JobState.FINISHED
    record = demand_of(j)
    assert record == DemandRecord(110.0, "small", "A100", 200.0, 400.0)


records = st.lists(
    st.builds(
        DemandRecord,
        end_time=st.floats(NOW - 20 * DAY, NOW + DAY),
        array_kind=st.sampled_from(["large", "small", "cpu"]),
        gpu_model=st.sampled_from(["A100", "V100", None]),
        gpu_seconds=st.floats(0, 1e7),
        core_seconds=st.floats(0, 1e7),
    ),
    max_size=30,
)
sizes = st.one_of(st.integers(0, 64).map(Size.count), st.floats(0, 1).map(Size.share))


@settings(max_examples=150, deadline=None)
@given(records, sizes, sizes, sizes, sizes, st.lists(st.sampled_from([1, 2, 4, 8]),
                                                     min_size=1, max_size=6))
def test_resized_arrays_stay_within_bounds(
    history: list[DemandRecord], lmin: Size, lmax: Size, cmin: Size, cmax: Size,
    gpus_per_node: list[int],
) -> None:
    config = ArrayConfig(default=ModelArrays(large_min=lmin, large_max=lmax,
                                             cpu_job_cores_min=cmin, cpu_job_cores_max=cmax))
    out = resize(config, history, NOW)
    state = ClusterState()
    for i, g in enumerate(gpus_per_node):
        state.upsert_node(gpu_node(f"n{i}", g, "A100" if i % 2 else "V100", cores=12))
    amap = build_array_map(state.snapshot({}).nodes, out)
    for model in ("A100", "V100"):
        arrays = out.for_model(model)
        assert (arrays.large_min, arrays.large_max) == (lmin, lmax)
        total = sum(g for i, g in enumerate(gpus_per_node) if (i % 2 == 1) == (model == "A100"))
        if total:
            assert amap.size(ArrayId("large", model)) <= lmax.resolve(total)
        want = arrays.large_gpus(total)
        assert want <= lmax.resolve(total)
        assert want >= min(lmin.resolve(total), lmax.resolve(total))
        cores = arrays.cpu_cores(12)
        assert min(cmin.resolve(12), cmax.resolve(12)) <= cores <= cmax.resolve(12)
        window = [
            r for r in history
            if NOW - config.history_days * DAY <= r.end_time <= NOW and r.array_kind != "cpu"
        ]
        # A model with records of its own is sized by them; one without follows the default
        # entry, which jobs naming no model size.
        own = [r for r in window if r.gpu_model == model] or [
            r for r in window if r.gpu_model is None
        ]
        demand = any(r.gpu_seconds > 0 for r in own)
        if demand and lmin.fraction and lmax.fraction and lmin.value <= lmax.value:
            # A share derived from demand is itself within fraction bounds.
            assert arrays.large.fraction
            assert lmin.value <= arrays.large.value <= lmax.value
