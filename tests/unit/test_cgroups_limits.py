"""GroupLimits validation and the kernel CPU-list format."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noded.cgroups import GroupLimits, format_cpu_list, parse_cpu_list


@pytest.mark.parametrize(
    ("text", "ids"),
    [("", ()), ("\n", ()), ("0", (0,)), ("0-1\n", (0, 1)), ("0-2,5,7-8", (0, 1, 2, 5, 7, 8))],
)
def test_parse_cpu_list(text: str, ids: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == ids


@pytest.mark.parametrize("text", ["a", "1-", "3-1", "-1", "0,,1", "1-2-3"])
def test_parse_cpu_list_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="bad CPU/node list"):
        parse_cpu_list(text)


def test_format_cpu_list_collapses_runs() -> None:
    assert format_cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_cpu_list([]) == ""


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_cpu_list_round_trip(ids: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(ids)) == tuple(sorted(ids))


def test_limits_normalise_to_sorted_tuples() -> None:
    lim = GroupLimits(cpus=[1, 0], mems=[0])  # type: ignore[arg-type]
    assert lim.cpus == (0, 1)
    assert lim.mems == (0,)
    assert lim == GroupLimits(cpus=(0, 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpus": ()}, "cpus must not be empty"),
        ({"cpus": (0, 0)}, "lists an entry twice"),
        ({"cpus": (-1,)}, "out of range"),
        ({"cpus": (True,)}, "must hold integers"),
        ({"cpus": "0-1"}, "sequence of integers"),
        ({"cpus": (0,), "mems": ()}, "mems must not be empty"),
        ({"cpus": (0,), "mems": (5000,)}, "mems entry 5000 is out of range"),
        ({"cpus": (0,), "memory_bytes": 512}, "below 1 MiB; the field is in bytes"),
        ({"cpus": (0,), "memory_bytes": 1.5e9}, "memory_bytes must be an integer"),
        ({"cpus": (0,), "cpu_quota_cores": 0}, "cpu_quota_cores=0 must be at least"),
        ({"cpus": (0,), "cpu_quota_cores": math.nan}, "must be at least"),
        ({"cpus": (0,), "cpu_quota_cores": "1"}, "must be a number"),
        ({"cpus": (0,), "net_classid": 0}, "net_classid must be an integer in 1..0xFFFFFFFF"),
        ({"cpus": (0,), "net_classid": 1 << 32}, "net_classid"),
    ],
)
def test_limits_reject_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GroupLimits(**kwargs)


def test_limits_dict_round_trip() -> None:
    lim = GroupLimits(
        cpus=(0, 1), mems=(0,), memory_bytes=1 << 30, cpu_quota_cores=1.5, net_classid=0x10002
    )
    assert GroupLimits.from_dict(lim.to_dict()) == lim


def test_limits_from_dict_names_problems() -> None:
    with pytest.raises(ValueError, match="unknown GroupLimits fields"):
        GroupLimits.from_dict({"cpus": [0], "gpus": [1]})
    with pytest.raises(ValueError, match="needs 'cpus'"):
        GroupLimits.from_dict({"mems": [0]})
    with pytest.raises(ValueError, match="sequence of integers"):
        GroupLimits.from_dict({"cpus": 3})
