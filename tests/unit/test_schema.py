"""The schema decoder: built objects equal ordinary construction; errors name the field."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.model import JobKind, JobSpec, QosClass
from shared.schema import SchemaError, bounded, decode, encode


@dataclass(frozen=True)
class Item:
    name: str = bounded(max_len=8)
    size: int = bounded(0, min=0, max=10)


@dataclass(frozen=True)
class Box:
    items: tuple[Item, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)


def test_job_spec_decodes_to_what_its_constructor_builds() -> None:
    wire = {"name": "train-1", "command": ["python3", "train.py"], "user": "alice", "gpus": 2,
            "cpus": 4, "tenant": "vision", "qos": "urgent", "env": {"A": "1"},
            "deadline": 1_800_000_000}
    spec = decode(JobSpec, wire)
    expected = JobSpec(name="train-1", command=("python3", "train.py"), user="alice", gpus=2,
                       cpus=4, tenant="vision", qos=QosClass.URGENT, env={"A": "1"},
                       deadline=1_800_000_000.0)
    assert spec == expected
    # Defaults are filled exactly as the generated __init__ fills them.
    assert {f.name: getattr(spec, f.name) for f in dataclasses.fields(JobSpec)} == \
        {f.name: getattr(expected, f.name) for f in dataclasses.fields(JobSpec)}
    assert spec.kind is JobKind.TRAINING and spec.memory_mib == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.gpus = 3  # type: ignore[misc]


def test_default_factories_give_each_object_its_own_value() -> None:
    a = decode(Box, {})
    b = decode(Box, {})
    assert a.tags == {} and a.labels == []
    assert a.tags is not b.tags and a.labels is not b.labels


def test_post_init_checks_still_run() -> None:
    with pytest.raises(SchemaError, match="job: a cpu job cannot ask for GPUs"):
        decode(JobSpec, {"name": "x", "command": ["true"], "user": "alice", "kind": "cpu",
                         "gpus": 1}, "job")
    with pytest.raises(SchemaError, match="command must not be empty"):
        decode(JobSpec, {"name": "x", "command": [], "user": "alice", "gpus": 1})


def test_errors_name_the_field_however_deep_and_however_often_seen() -> None:
    for _ in range(3):  # cached paths give the same answer every time
        with pytest.raises(SchemaError) as exc:
            decode(JobSpec, {"name": "x", "command": ["a", 5], "user": "alice", "gpus": 1},
                   "params.job")
        assert exc.value.field == "params.job.command[1]"
        with pytest.raises(SchemaError) as exc:
            decode(JobSpec, {"command": ["a"], "user": "alice", "gpus": 1}, "params.job")
        assert exc.value.field == "params.job.name"
        with pytest.raises(SchemaError) as exc:
            decode(JobSpec, {"name": "x", "command": ["a"], "user": "alice", "gpus": -1})
        assert exc.value.field == "gpus" and "at least 0" in exc.value.reason
    # Items far down a long list, and more parents than the path cache keeps.
    items = [{"name": f"i{i}"} for i in range(400)] + [{"name": "much-too-long"}]
    with pytest.raises(SchemaError) as exc:
        decode(Box, {"items": items}, "box")
    assert exc.value.field == "box.items[400].name"
    items[300] = {"name": "ok", "size": 11}
    with pytest.raises(SchemaError) as exc:
        decode(Box, {"items": items}, "box")
    assert exc.value.field == "box.items[300].size"
    long_list = ["a"] * 50 + [7]
    with pytest.raises(SchemaError) as exc:
        decode(Box, {"labels": long_list}, "other")
    assert exc.value.field == "other.labels[50]"


@dataclass(init=False)
class OwnInit:
    name: str = ""

    def __init__(self, name: str = "") -> None:
        self.name = name.upper()  # the class's own __init__ must run


@dataclass
class CustomSetattr:
    name: str = ""

    def __setattr__(self, key: str, value: object) -> None:
        object.__setattr__(self, key, f"<{value}>")


@dataclass(frozen=True, slots=True)
class Slotted:
    name: str = ""


@dataclass
class NotInInit:
    name: str = ""
    seen: int = field(default=7, init=False)


@pytest.mark.parametrize(("cls", "expected"), [
    (OwnInit, "X"), (CustomSetattr, "<x>"), (Slotted, "x"), (NotInInit, "x"),
])
def test_classes_whose_init_does_more_are_built_by_it(cls: type, expected: str) -> None:
    obj = decode(cls, {"name": "x"})
    assert type(obj) is cls and obj.name == expected
    if cls is NotInInit:
        assert obj.seen == 7


def test_list_items_are_checked_in_one_pass_and_failures_still_named() -> None:
    base = {"name": "x", "user": "alice", "gpus": 1}
    spec = decode(JobSpec, {**base, "command": ["python3", "-c", "print(1)"]})
    assert spec.command == ("python3", "-c", "print(1)")
    # JobSpec.command allows items of at most 1,024 characters, not the general 4,096.
    with pytest.raises(SchemaError) as exc:
        decode(JobSpec, {**base, "command": ["python3", "a" * 1025]}, "job")
    assert exc.value.field == "job.command[1]" and "at most 1024" in exc.value.reason
    with pytest.raises(SchemaError) as exc:
        decode(JobSpec, {**base, "command": ["python3", "bad\x00arg"]}, "job")
    assert exc.value.field == "job.command[1]" and "NUL" in exc.value.reason
    with pytest.raises(SchemaError) as exc:
        decode(JobSpec, {**base, "command": ["python3", None]}, "job")
    assert exc.value.field == "job.command[1]"


def test_a_string_that_matched_once_is_remembered_but_a_bad_one_never_passes() -> None:
    base = {"command": ["true"], "gpus": 1}
    for _ in range(2):
        assert decode(JobSpec, {**base, "name": "ok-1", "user": "alice"}).name == "ok-1"
    # Unhashable, wrong-typed and non-matching values are refused every time.
    for bad_user in ("Alice!", ["alice"], {"a": 1}, 7, "alice\x00"):
        for _ in range(2):
            with pytest.raises(SchemaError) as exc:
                decode(JobSpec, {**base, "name": "ok-1", "user": bad_user})
            assert exc.value.field == "user"
    # Far more distinct names than are remembered: each still checked.
    for i in range(5000):
        decode(JobSpec, {**base, "name": f"n-{i}", "user": "alice"})
    with pytest.raises(SchemaError):
        decode(JobSpec, {**base, "name": "-starts-with-dash", "user": "alice"})


def test_decoded_objects_are_no_bigger_than_constructed_ones() -> None:
    """An earlier builder filled each instance dict in its own order: every job spec got a
    private key table, three times the memory, and constructed specs lost key sharing too."""
    import tracemalloc

    wire = {"name": "big-1", "command": ["python3", "train.py"], "user": "alice", "gpus": 2,
            "cpus": 2, "tenant": "bench", "qos": "normal"}

    def per_object(make: Any) -> float:
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            kept = [make() for _ in range(2000)]
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        assert len(kept) == 2000
        return sum(s.size_diff for s in after.compare_to(before, "filename")) / 2000

    decoded = per_object(lambda: decode(JobSpec, wire))
    constructed = per_object(lambda: JobSpec(
        name="big-1", command=tuple(wire["command"]), user="alice", gpus=2, cpus=2,
        tenant="bench", qos=QosClass.NORMAL))
    assert decoded <= 1.2 * constructed, (decoded, constructed)
    # Both about 400 bytes (a spec and its command tuple) on CPython 3.11; a private key
    # table per instance, for either kind, makes it over 1,000.
    assert decoded < 700 and constructed < 700, (decoded, constructed)
    # Defaults not stored on a decoded instance read the same as stored ones.
    spec = decode(JobSpec, wire)
    assert spec.gpu_model is None and spec.memory_mib == 0 and spec.kind is JobKind.TRAINING
    assert dataclasses.replace(spec, gpus=1).gpus == 1 and dataclasses.asdict(spec)["cpus"] == 2


def test_specs_stay_compact_when_the_first_one_is_decoded() -> None:
    """In a fresh interpreter (as in the master, whose first spec comes off the wire), a
    decoded spec must not lay out the class's shared keys in its own order."""
    import subprocess
    import textwrap
    from pathlib import Path

    probe = textwrap.dedent("""
        import sys, tracemalloc
        from shared.schema import decode
        from shared.model import JobSpec
        wire = {"name": "a", "command": ["x"], "user": "alice", "gpus": 1, "cpus": 2,
                "tenant": "t", "qos": "normal"}
        for _ in range(100):
            decode(JobSpec, wire)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        kept = [JobSpec(name="a", command=("x",), user="alice", gpus=1) for _ in range(2000)]
        after = tracemalloc.take_snapshot()
        print(sum(s.size_diff for s in after.compare_to(before, "filename")) / 2000)
    """)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True,
                         text=True, check=True, timeout=60)
    assert float(out.stdout) < 600, out.stdout


def test_a_spec_written_before_its_traits_were_grouped_still_decodes() -> None:
    """Journals and job files from before: SODA's traits were top-level fields."""
    old = {"name": "a", "command": ["x"], "user": "alice", "gpus": 1,
           "pipelined_input": True, "heavy_preprocessing": None,
           "traits": {"large_weights": True}}
    spec = decode(JobSpec, old)
    assert (spec.traits.pipelined_input, spec.traits.large_weights,
            spec.traits.heavy_preprocessing) == (True, True, None)
    assert old["traits"] == {"large_weights": True}  # the caller's map is left alone
    assert decode(JobSpec, encode(spec)) == spec  # written anew in the grouped form
    with pytest.raises(SchemaError, match=r"unknown field.*'large_weight'"):
        decode(JobSpec, {**old, "large_weight": True})
