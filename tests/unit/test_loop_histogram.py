"""The loop-only histogram exposes what the client library's histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from masterd.api.metrics import RPC_BUCKETS, LoopHistogram


def samples(registry: CollectorRegistry, name: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        if family.name != name:
            continue
        for s in family.samples:
            if s.name.endswith("_created"):
                continue  # the client library's creation time; nothing to compare
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_same_buckets_sums_and_counts_as_the_client_library() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LoopHistogram("x_seconds", "doc", RPC_BUCKETS, label="method")
    ours.register(mine)
    reference = Histogram("x_seconds", "doc", ["method"], buckets=RPC_BUCKETS,
                          registry=theirs)
    # Values on, between, below and above the bounds.
    values = [0.0, 0.0005, 0.0006, 0.001, 0.0049, 0.005, 0.3, 5.0, 7.5, 1e-9]
    for i, v in enumerate(values):
        method = "submit" if i % 2 else "ping"
        mine.observe(v, method)
        reference.labels(method).observe(v)
    got, want = samples(ours, "x_seconds"), samples(theirs, "x_seconds")
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-12, key


def test_unlabelled_histogram() -> None:
    registry = CollectorRegistry()
    h = LoopHistogram("y_seconds", "doc", (0.1, 1.0))
    registry.register(h)
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    got = samples(registry, "y_seconds")
    assert got[("y_seconds_bucket", (("le", "0.1"),))] == 1
    assert got[("y_seconds_bucket", (("le", "1.0"),))] == 2
    assert got[("y_seconds_bucket", (("le", "+Inf"),))] == 3
    assert got[("y_seconds_count", ())] == 3
    assert abs(got[("y_seconds_sum", ())] - 5.55) < 1e-9
