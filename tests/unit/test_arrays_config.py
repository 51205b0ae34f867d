"""Configuration of the multi-array pools: sizes, bounds, tenants, inner policies."""

from __future__ import annotations

import pytest

from masterd.core.arrays import (
    ArrayConfig,
    ArrayConfigError,
    ArrayPolicy,
    Quota,
    Size,
    parse_size,
)
from masterd.core.policies import make_policy, soda_arrays
from masterd.core.policies.drf import DrfPolicy


def test_sizes_parse_as_counts_fractions_and_percentages() -> None:
    assert parse_size(4, "x") == Size.count(4)
    assert parse_size(0.25, "x") == Size.share(0.25)
    assert parse_size("50%", "x") == Size.share(0.5)
    assert parse_size(1, "x").resolve(8) == 1
    assert parse_size(1.0, "x").resolve(8) == 8


def test_sizes_resolve_within_capacity_rounding_half_up() -> None:
    assert Size.share(0.5).resolve(3) == 2
    assert Size.share(0.0).resolve(10) == 0
    assert Size.count(100).resolve(16) == 16


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (True, "must be a count"),
        (-1, "must not be negative"),
        (1.5, "fraction must lie in"),
        ("abc%", "not a percentage"),
        ("150%", "must lie in"),
        ("4", "must be a count"),
        (None, "must be a count"),
    ],
)
def test_bad_sizes_are_named(raw: object, message: str) -> None:
    with pytest.raises(ArrayConfigError, match=message) as info:
        parse_size(raw, "arrays.models.A100.large")
    assert "arrays.models.A100.large" in str(info.value)


def test_table_builds_models_tenants_and_inner() -> None:
    config = ArrayConfig.from_table(
        {
            "borrowing": False,
            "history_days": 3,
            "default_gpu_model": "A100",
            "inner": {"small": "fifo", "large": {"name": "fifo", "backfill": True}},
            "models": {
                "*": {"large": 0.25, "cpu_job_cores": 2},
                "V100": {"large": 16, "large_max": "50%"},
            },
            "tenants": {
                "vision": {
                    "weight": 2,
                    "borrow_over_quota": True,
                    "quota": {"small": {"gpus": 8}, "large:A100": {"gpus": 16, "cores": 64}},
                }
            },
        }
    )
    assert config.borrowing is False
    assert config.history_days == 3.0
    assert config.for_model("A100").large == Size.share(0.25)
    # A model entry starts from the "*" entry and overrides what it names.
    assert config.for_model("V100").large == Size.count(16)
    assert config.for_model("V100").cpu_job_cores == Size.count(2)
    assert config.for_model("V100").large_gpus(64) == 16
    assert config.for_model("V100").large_gpus(16) == 8  # large_max 50% of 16
    vision = config.tenant("vision")
    assert vision.weight == 2.0 and vision.borrow_over_quota
    assert vision.quota_for("large:A100", "large") == Quota(gpus=16, cores=64)
    assert vision.quota_for("large:V100", "large") == Quota()
    assert vision.quota_for("small:V100", "small") == Quota(gpus=8)
    assert config.tenant("nobody").quota_for("cpu", "cpu") == Quota()
    assert config.inner["large"].options == {"backfill": True}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"borrow": True}, "arrays: unknown key"),
        ({"borrowing": "yes"}, "arrays.borrowing: must be true or false"),
        ({"history_days": 0}, "arrays.history_days"),
        ({"models": {"A100": {"big": 1}}}, "arrays.models.A100: unknown key"),
        ({"models": {"A100": {"large_min": 0.6, "large_max": 0.4}}}, "large_min"),
        ({"models": []}, "arrays.models: must be a table"),
        ({"tenants": {"../x": {}}}, "not a valid tenant name"),
        ({"tenants": {"t": {"weight": 0}}}, "arrays.tenants.t.weight"),
        ({"tenants": {"t": {"quota": {"huge": {"gpus": 1}}}}}, "arrays.tenants.t.quota.huge"),
        ({"tenants": {"t": {"quota": {"small": {"gpus": -1}}}}}, "quota.small.gpus"),
        ({"inner": {"tiny": "fifo"}}, "arrays.inner: 'tiny' is not an array kind"),
        ({"inner": {"small": {"backfill": True}}}, "arrays.inner.small.name"),
    ],
)
def test_bad_tables_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ArrayConfigError, match=message):
        ArrayConfig.from_table(table)


def test_policy_rejects_unknown_or_nested_inner_policies() -> None:
    with pytest.raises(ArrayConfigError, match=r"inner.small: unknown policy 'nope'; known:.*fifo"):
        soda_arrays(inner={"small": "nope"})
    with pytest.raises(ArrayConfigError, match="cannot nest"):
        soda_arrays(inner={"cpu": "soda-arrays"})
    with pytest.raises(ArrayConfigError, match="not both"):
        soda_arrays(ArrayConfig(), borrowing=False)
    with pytest.raises(ArrayConfigError, match="inner_factories"):
        soda_arrays(inner_factories={"gpu": DrfPolicy})


def test_registry_builds_both_policies_from_options() -> None:
    arrays = make_policy("soda-arrays", borrowing=False, models={"*": {"large": 0}})
    assert isinstance(arrays, ArrayPolicy) and arrays.config.borrowing is False
    drf = make_policy("drf", weights={"a": 2})
    assert isinstance(drf, DrfPolicy) and drf.weights == {"a": 2.0}


def test_quota_allows_up_to_the_limit() -> None:
    quota = Quota(gpus=4, cores=None)
    assert quota.allows(2, 100, 2, 1000)
    assert not quota.allows(3, 0, 2, 0)
    assert Quota().allows(10**6, 10**6, 1, 1)
