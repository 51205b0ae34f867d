"""Running many independent replays: in this process, or on Dask (DESIGN principle 8).

A study hands a :class:`Runner` a plain function and the list of its inputs; ``map`` returns
the outputs in the inputs' order. Each replay is seeded by its input alone (the simulator
derives every draw from the seed and the job's key, never from process state), so where a
replay runs cannot change what it computes: a study gives the same numbers bit for bit on
:class:`SerialRunner` and on :class:`DaskRunner` (tests/unit/test_sim_parallel.py checks it).

- :class:`SerialRunner`: one after the other in this process (tests, ``--serial``).
- :class:`DaskRunner`: on a ``dask.distributed`` cluster — by default a ``LocalCluster`` of
  worker processes on this machine (one single-threaded worker per core: replays are pure
  Python, threads would only share the GIL), or an operator's existing cluster given by its
  scheduler's address (``trellis-sim report --scheduler tcp://host:8786``), whose workers
  must have the same Trellis installed.

Functions and inputs travel by pickle (cloudpickle for functions): keep them module-level
functions and dataclasses, and return what the study needs rather than whole replays where
those are large.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar

log = logging.getLogger("trellis.sim.parallel")

T = TypeVar("T")
R = TypeVar("R")


class RunnerError(RuntimeError):
    """The runner cannot be started or reached (Dask missing, scheduler unreachable)."""


class Runner(Protocol):
    """Maps a function over inputs; results in input order."""

    description: str

    def map(self, fn: Callable[[T], R], items: Sequence[T], label: str = "") -> list[R]: ...


class SerialRunner:
    """Everything in this process, in order."""

    description = "serially in one process"

    def map(self, fn: Callable[[T], R], items: Sequence[T], label: str = "") -> list[R]:
        return [fn(item) for item in items]

    def __enter__(self) -> SerialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class DaskRunner:
    """Replays on a Dask cluster: a private ``LocalCluster`` or the one at ``scheduler``."""

    def __init__(
        self,
        scheduler: str | None = None,
        workers: int | None = None,
        show: bool = False,
        connect_timeout_s: float = 30.0,
    ) -> None:
        if workers is not None and workers < 1:
            raise RunnerError(f"workers must be at least 1, got {workers}")
        if scheduler is not None and workers is not None:
            raise RunnerError("--workers sizes a local cluster; an existing scheduler "
                              "(--scheduler) brings its own workers")
        self.scheduler = scheduler
        self.workers = workers or (os.cpu_count() or 1)
        self.show = show
        self.connect_timeout_s = connect_timeout_s
        self._cluster: Any = None
        self._client: Any = None
        self.description = ""

    def __enter__(self) -> DaskRunner:
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise RunnerError(
                "Dask is not installed: pip install 'trellis[sim]' (dask[distributed]), "
                "or run serially with --serial"
            ) from None
        if not log.isEnabledFor(logging.DEBUG):
            # Dask's INFO chatter is not the report's (trellis-sim -v shows it).
            logging.getLogger("distributed").setLevel(logging.WARNING)
        try:
            if self.scheduler is None:
                self._cluster = LocalCluster(
                    n_workers=self.workers, threads_per_worker=1, processes=True,
                    dashboard_address=None, silence_logs=logging.ERROR,
                )
                self._client = Client(self._cluster)
                self.description = (f"on Dask (a LocalCluster of {self.workers} worker "
                                    f"process{'es' if self.workers > 1 else ''})")
            else:
                self._client = Client(self.scheduler, timeout=self.connect_timeout_s)
                count = len(self._client.scheduler_info().get("workers", {}))
                self.description = f"on Dask (scheduler {self.scheduler}, {count} workers)"
        except (OSError, TimeoutError) as exc:
            self.__exit__(None, None, None)
            where = self.scheduler or "a local cluster"
            raise RunnerError(f"cannot start or reach Dask at {where}: {exc}") from None
        log.info("dask_runner %s", self.description)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def map(self, fn: Callable[[T], R], items: Sequence[T], label: str = "") -> list[R]:
        if self._client is None:
            raise RunnerError("the Dask runner is not started (use it in a with block)")
        if not items:
            return []
        from dask.distributed import as_completed

        # pure=False: equal inputs are still separate replays (and never served from cache).
        futures = self._client.map(fn, list(items), pure=False)
        started = time.monotonic()
        for done, _ in enumerate(as_completed(futures), start=1):
            if self.show:
                print(f"\r{label or 'replays'}: {done}/{len(futures)} done "
                      f"({time.monotonic() - started:.0f} s)", end="", file=sys.stderr,
                      flush=True)
        if self.show:
            print(file=sys.stderr)
        # gather raises the first failed task's exception, with its remote traceback.
        return list(self._client.gather(futures))


def open_runner(
    scheduler: str | None = None,
    workers: int | None = None,
    serial: bool = False,
    show: bool = False,
) -> SerialRunner | DaskRunner:
    """The runner the options ask for (a context manager: use it in a ``with`` block)."""
    if serial:
        if scheduler is not None or workers is not None:
            raise RunnerError("--serial runs in this process: drop --scheduler/--workers")
        return SerialRunner()
    return DaskRunner(scheduler=scheduler, workers=workers, show=show)
