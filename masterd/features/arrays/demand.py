"""The demand SODA's array re-sizing looks back over, kept without keeping the jobs.

``resize`` (masterd/core/arrays/resize.py) only sums ended jobs' GPU- and core-seconds per
array kind and GPU model over a window of days. The master used to hand it every ended job
still in its memory; with a bounded job table (``finished_jobs_in_memory``) those are no
longer the window's jobs, and a week of a busy cluster's jobs is too many to keep anyway.
So the demand is summed as jobs end, per time bucket of about a thousandth of the window:
memory is bounded by the window, not by the jobs in it, and the window's edges move in bucket
steps.
"""

from __future__ import annotations

from masterd.core.arrays.resize import DemandRecord

MIN_BUCKET_S = 60.0
BUCKETS = 1024  # per window


class DemandLog:
    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"the demand window must be positive, got {window_s!r} s")
        self.window_s = window_s
        self.bucket_s = max(MIN_BUCKET_S, window_s / BUCKETS)
        # (bucket, array kind, GPU model) -> [latest end time, GPU-s, core-s, jobs]
        self._sums: dict[tuple[int, str, str | None], list[float]] = {}
        self._newest = -1  # the newest bucket seen; a new one triggers a prune

    def add(self, record: DemandRecord) -> None:
        bucket = int(record.end_time // self.bucket_s)
        key = (bucket, record.array_kind, record.gpu_model)
        sums = self._sums.get(key)
        if sums is None:
            self._sums[key] = [record.end_time, record.gpu_seconds, record.core_seconds, 1]
        else:
            sums[0] = max(sums[0], record.end_time)
            sums[1] += record.gpu_seconds
            sums[2] += record.core_seconds
            sums[3] += 1
        if bucket > self._newest:
            self._newest = bucket
            self.prune(record.end_time)

    def prune(self, now: float) -> None:
        """Drop buckets that ended before the window that ends at ``now``."""
        oldest = int((now - self.window_s) // self.bucket_s)
        for key in [k for k in self._sums if k[0] < oldest]:
            del self._sums[key]

    def records(self, since: float) -> list[DemandRecord]:
        """One record per bucket, array kind and GPU model that has demand ending at or
        after ``since`` (dated by its latest end)."""
        return [DemandRecord(end_time=end, array_kind=kind, gpu_model=model,
                             gpu_seconds=gpu_s, core_seconds=core_s)
                for (_, kind, model), (end, gpu_s, core_s, _) in self._sums.items()
                if end >= since]

    def jobs(self, since: float) -> int:
        """How many jobs :meth:`records` (same ``since``) sums."""
        return int(sum(sums[3] for sums in self._sums.values() if sums[0] >= since))

    def __len__(self) -> int:
        return len(self._sums)
