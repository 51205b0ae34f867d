"""shared.schema.encode gives exactly what an obvious independent encoder gives, and the
per-job wire cache hands back the same encoding until the job holds another spec or placement."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, replace
from typing import Any

from masterd.journal.wire import WireCache
from masterd.service.master import prepare_wire
from shared.messages import CorePlan, PrepareJob, StopJob
from shared.model import (
    CpuCore,
    CpuTraits,
    GpuInfo,
    Job,
    JobKind,
    JobSpec,
    NodeAllocation,
    NodeInventory,
    NodeSelector,
    Placement,
    QosClass,
)
from shared.schema import decode, encode

SPEC = JobSpec(name="train", command=("python", "x.py"), user="nobody", kind=JobKind.TRAINING,
               qos=QosClass.NORMAL, gpus=2, cpus=4, env={"A": "1", "B": "two"},
               deadline=12.5, traits=CpuTraits(pipelined_input=True),
               selector=NodeSelector(features=("a100", "ib")))
PLACEMENT = Placement((NodeAllocation(node="n1", gpus=(0, 1), cpus=(2, 3), memory_mib=64),
                       NodeAllocation(node="n2", gpus=(3,), cpus=())))


@dataclass(frozen=True)
class Odd:
    tags: frozenset[str]
    nested: dict[str, tuple[int, ...]]
    items: list[NodeAllocation]
    nothing: None = None


def reference(obj: Any) -> Any:
    """The obvious encoder, written independently: what the fast one must agree with."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: reference(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [reference(v) for v in obj]
    if isinstance(obj, dict):
        return {reference(k): reference(v) for k, v in obj.items()}
    if isinstance(obj, frozenset | set):
        return sorted(reference(v) for v in obj)
    return obj


def test_encode_matches_the_schema_encoder() -> None:
    inventory = NodeInventory(
        name="n1", hostname="h", address="10.0.0.1", memory_mib=1024,
        gpus=tuple(GpuInfo(index=i, uuid=f"GPU-{i}", model="A100", memory_mib=40960)
                   for i in range(2)),
        cpus=tuple(CpuCore(id=i) for i in range(4)))
    samples = [
        SPEC, PLACEMENT, inventory, StopJob(job_id="j-1", grace_s=3.0, reason="why"),
        Odd(frozenset({"b", "a"}), {"k": (1, 2)}, [PLACEMENT.allocations[0]]),
        {"plain": [1, 2.5, "s", None, True, b"raw"]}, JobKind.CPU, 7, "text",
    ]
    for sample in samples:
        assert encode(sample) == reference(sample)


def test_cache_reuses_an_encoding_until_the_object_changes() -> None:
    cache = WireCache()
    job = Job(id="j-1", spec=SPEC, submit_time=1.0)
    assert cache.placement(job) is None
    first = cache.spec(job)
    assert first == reference(SPEC)
    assert cache.spec(job) is first
    job.placement = PLACEMENT
    placed = cache.placement(job)
    assert placed == reference(PLACEMENT) and cache.placement(job) is placed
    # A new placement (a retry lands elsewhere) is encoded afresh, never served stale.
    job.placement = Placement((NodeAllocation(node="n9", cpus=(1,)),))
    assert cache.placement(job) == reference(job.placement)
    job.spec = replace(SPEC, cpus=8)
    assert cache.spec(job)["cpus"] == 8
    cache.forget(job.id)
    assert len(cache) == 0


def test_cache_stays_within_its_limit() -> None:
    cache = WireCache(limit=10)
    for i in range(35):
        cache.spec(Job(id=f"j-{i}", spec=SPEC, submit_time=0.0))
    assert len(cache) <= 10
    newest = Job(id="j-34", spec=SPEC, submit_time=0.0)
    assert cache.spec(newest) == reference(SPEC)


def test_prepare_wire_is_the_message_with_the_cached_spec() -> None:
    message = PrepareJob(job_id="j-1", spec=SPEC, allocation=PLACEMENT.allocations[0],
                         node_rank=1, nnodes=2, cores=None)
    wire = prepare_wire(message, encode(SPEC))
    assert wire == reference(message)
    assert decode(PrepareJob, wire) == message
    planned = replace(message, cores=CorePlan(n_start=2, warm=True, launch_cores=2))
    assert prepare_wire(planned, encode(SPEC)) == reference(planned)
