"""Short garbage-collector pauses for a master that holds many long-lived objects.

CPython's cyclic collector scans every tracked object of the generations it collects. Under
``bench/load.py`` the master's full collections walked a few hundred thousand objects and
stopped the event loop for 150-250 ms, and its middle-generation collections took 25-40 ms:
most of a request's p99 budget gone at once. The objects alive at a collection are, with few
exceptions, long-lived: jobs, sessions, the cluster state, requests in flight that will be
freed by reference counting when they finish. So after every collection the policy freezes
what survived (``gc.freeze``): the next collection of any generation walks only what was
allocated since the previous one, and every pause stays short.

The price: an object frozen while alive and later dropped inside a reference cycle is not
reclaimed until the next refreeze. The master makes almost no cyclic garbage (a
``gc.DEBUG_SAVEALL`` probe under full load found none in 3 s), and every ``refreeze_s`` the
policy unfreezes, collects everything once and freezes again: one long pause an hour instead
of several a second under load.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("trellis.master.gc")


@dataclass
class GcStats:
    full_collections: int = 0
    refreezes: int = 0
    longest_full_s: float = 0.0


class GcPausePolicy:
    """Installs the freeze-after-full-collection policy on this interpreter's collector."""

    def __init__(self, young_threshold: int = 700, refreeze_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if young_threshold < 1:
            raise ValueError(f"young_threshold must be at least 1, got {young_threshold}")
        if refreeze_s <= 0:
            raise ValueError(f"refreeze_s must be positive, got {refreeze_s}")
        self.young_threshold = young_threshold
        self.refreeze_s = refreeze_s
        self.clock = clock
        self.stats = GcStats()
        self._saved_threshold: tuple[int, int, int] | None = None
        self._started = 0.0
        self._last_refreeze = 0.0

    def install(self) -> None:
        """Call once the long-lived state is loaded (after the store is restored)."""
        if self._saved_threshold is not None:
            return
        self._saved_threshold = gc.get_threshold()
        _, middle, old = self._saved_threshold
        # Python's own default (700) measured best under bench/load.py: a young collection
        # walks every young object still alive, so a larger threshold (10,000 tried) made
        # each one take tens of milliseconds, which is what p99 sees.
        gc.set_threshold(self.young_threshold, middle, old)
        gc.collect()
        gc.freeze()
        self._last_refreeze = self.clock()
        gc.callbacks.append(self._on_gc)
        log.info("gc: %d objects frozen after startup; young threshold %d, refreeze every "
                 "%.0f s", gc.get_freeze_count(), self.young_threshold, self.refreeze_s)

    def uninstall(self) -> None:
        if self._saved_threshold is None:
            return
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.set_threshold(*self._saved_threshold)
        gc.unfreeze()
        self._saved_threshold = None

    def maybe_refreeze(self) -> bool:
        """Unfreeze, collect all and freeze again if ``refreeze_s`` has passed (call from a
        timer: this is the one long pause, taken deliberately)."""
        if self._saved_threshold is None or self.clock() - self._last_refreeze < self.refreeze_s:
            return False
        started = time.perf_counter()
        gc.unfreeze()
        collected = gc.collect()
        gc.freeze()
        self._last_refreeze = self.clock()
        self.stats.refreezes += 1
        log.info("gc: refreeze collected %d objects in %.0f ms; %d frozen", collected,
                 (time.perf_counter() - started) * 1000, gc.get_freeze_count())
        return True

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        generation = info.get("generation", 0)
        if phase == "start":
            if generation == 2:
                self._started = time.perf_counter()
            return
        if generation == 2:
            elapsed = time.perf_counter() - self._started
            self.stats.full_collections += 1
            self.stats.longest_full_s = max(self.stats.longest_full_s, elapsed)
        # Whatever survived this collection is long-lived or about to be freed by reference
        # counting: either way the next collections need not walk it again.
        gc.freeze()
