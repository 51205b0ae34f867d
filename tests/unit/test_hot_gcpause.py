"""masterd.gcpause.GcPausePolicy on this interpreter's real collector.

Every test leaves the collector as it found it (threshold, callbacks, frozen objects,
enabled flag), through the ``collector`` fixture, even when an assertion fails.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from masterd.gcpause import GcPausePolicy


class _Cyclic:
    """An object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def collector() -> Iterator[list[GcPausePolicy]]:
    """Policies appended to the yielded list are uninstalled, then the collector restored."""
    threshold = gc.get_threshold()
    callbacks = list(gc.callbacks)
    enabled = gc.isenabled()
    frozen_before = gc.get_freeze_count()
    # Automatic collections would make the counts below depend on allocation timing; the
    # explicit gc.collect() calls still run the callbacks.
    gc.disable()
    policies: list[GcPausePolicy] = []
    try:
        yield policies
    finally:
        for policy in policies:
            policy.uninstall()
        gc.callbacks[:] = callbacks
        gc.set_threshold(*threshold)
        if frozen_before == 0:
            gc.unfreeze()
        if enabled:
            gc.enable()


def _scanned(obj: object) -> bool:
    """Whether a collection would look at ``obj``: frozen objects are in no generation."""
    return any(o is obj for o in gc.get_objects())


def test_install_raises_young_threshold_and_freezes(collector: list[GcPausePolicy]) -> None:
    _, middle, old = gc.get_threshold()
    policy = GcPausePolicy(young_threshold=12_345, refreeze_s=60.0)
    collector.append(policy)
    policy.install()
    assert gc.get_threshold() == (12_345, middle, old)
    assert gc.get_freeze_count() > 0
    assert gc.callbacks.count(policy._on_gc) == 1
    # A second install changes nothing (no second callback, threshold saved once).
    policy.install()
    assert gc.callbacks.count(policy._on_gc) == 1


def test_every_collection_is_followed_by_a_freeze(collector: list[GcPausePolicy]) -> None:
    policy = GcPausePolicy(refreeze_s=60.0)
    collector.append(policy)
    policy.install()
    young = [object()]  # a tracked container made after the startup freeze
    assert _scanned(young)
    frozen = gc.get_freeze_count()

    gc.collect(0)  # a young collection: what survived it is frozen too
    assert policy.stats.full_collections == 0
    assert not _scanned(young)
    assert gc.get_freeze_count() > frozen

    assert policy.stats.longest_full_s == 0.0  # young collections are not timed

    later = [object()]
    assert _scanned(later)
    before = time.perf_counter()
    gc.collect()
    first_wall = time.perf_counter() - before
    assert policy.stats.full_collections == 1
    # The full collection was timed from inside the call: more than nothing, no longer than
    # the call itself.
    first = policy.stats.longest_full_s
    assert 0.0 < first <= first_wall
    assert not _scanned(later)
    before = time.perf_counter()
    gc.collect()
    second_wall = time.perf_counter() - before
    assert policy.stats.full_collections == 2
    # The longest of the two: at least the first, and within the longer of the two calls.
    assert first <= policy.stats.longest_full_s <= max(first_wall, second_wall)


def test_young_garbage_cycles_are_still_collected(collector: list[GcPausePolicy]) -> None:
    """Freezing only takes survivors: a cycle already unreachable at a young collection is
    freed by that collection, as without the policy."""
    policy = GcPausePolicy(refreeze_s=60.0)
    collector.append(policy)
    policy.install()
    cyclic = _Cyclic()
    ref = weakref.ref(cyclic)
    del cyclic
    gc.collect(0)
    assert ref() is None


def test_refreeze_honours_the_period(collector: list[GcPausePolicy]) -> None:
    clock = _Clock(100.0)
    policy = GcPausePolicy(refreeze_s=50.0, clock=clock)
    collector.append(policy)
    policy.install()

    cyclic = _Cyclic()
    ref = weakref.ref(cyclic)
    gc.collect()  # it survives (still referenced) and is frozen after the collection
    del cyclic
    gc.collect()
    assert ref() is not None, "frozen cyclic garbage must wait for the refreeze"

    clock.now = 149.9
    assert policy.maybe_refreeze() is False
    assert policy.stats.refreezes == 0
    assert ref() is not None

    clock.now = 150.0
    assert policy.maybe_refreeze() is True
    assert policy.stats.refreezes == 1
    assert ref() is None, "the refreeze unfreezes and collects everything once"
    assert gc.get_freeze_count() > 0

    assert policy.maybe_refreeze() is False  # the period restarts at the refreeze
    clock.now = 199.9
    assert policy.maybe_refreeze() is False
    clock.now = 200.0
    assert policy.maybe_refreeze() is True
    assert policy.stats.refreezes == 2


def test_refreeze_does_nothing_unless_installed(collector: list[GcPausePolicy]) -> None:
    clock = _Clock(0.0)
    policy = GcPausePolicy(refreeze_s=1.0, clock=clock)
    collector.append(policy)
    clock.now = 1000.0
    assert policy.maybe_refreeze() is False
    policy.install()
    policy.uninstall()
    clock.now = 5000.0
    assert policy.maybe_refreeze() is False
    assert policy.stats.refreezes == 0
    assert gc.get_freeze_count() == 0


def test_uninstall_restores_the_collector(collector: list[GcPausePolicy]) -> None:
    before = gc.get_threshold()
    policy = GcPausePolicy(young_threshold=before[0] + 777, refreeze_s=60.0)
    collector.append(policy)
    policy.install()
    policy.install()
    assert gc.get_threshold() != before
    policy.uninstall()
    assert gc.get_threshold() == before
    assert policy._on_gc not in gc.callbacks
    assert gc.get_freeze_count() == 0
    marker = [object()]
    gc.collect()  # no callback any more: not counted, nothing frozen
    assert policy.stats.full_collections == 0
    assert gc.get_freeze_count() == 0
    assert _scanned(marker)
    policy.uninstall()  # twice is harmless
    assert gc.get_threshold() == before


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"young_threshold": 0}, "young_threshold"),
    ({"young_threshold": -5}, "young_threshold"),
    ({"refreeze_s": 0.0}, "refreeze_s"),
    ({"refreeze_s": -1.0}, "refreeze_s"),
])
def test_bad_arguments_name_the_argument(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        GcPausePolicy(**kwargs)  # type: ignore[arg-type]
