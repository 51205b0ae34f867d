"""When to partition: only while the node hosts a multi-node GPU job (SODA §V-E).

Jobs on one node only contend for the NIC with each other when some GPU job talks to other
nodes; otherwise shaping would only cost throughput. The partitioner keeps the node's job list,
installs the HTB partition and classifies every known job when the first multi-node GPU job
arrives, and unclassifies everything and restores the original qdisc when the last one leaves
or when noded stops (``close``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from noded.netshape.classify import JobClassifier, JobNetKind, JobTarget
from noded.netshape.errors import NetShapeError
from noded.netshape.htb import TrafficShaper

log = logging.getLogger("trellis.netshape")


@dataclass(frozen=True)
class NetJob:
    job_id: str
    kind: JobNetKind
    target: JobTarget  # pids or the job's cgroup, as the classifier takes them
    multi_node: bool


class BandwidthPartitioner:
    def __init__(self, shaper: TrafficShaper, classifier: JobClassifier) -> None:
        self.shaper = shaper
        self.classifier = classifier
        self._jobs: dict[str, NetJob] = {}
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    def jobs(self) -> dict[str, NetJob]:
        return dict(self._jobs)

    def job_started(
        self, job_id: str, kind: JobNetKind, target: JobTarget, *, multi_node: bool = False
    ) -> None:
        if kind not in ("gpu", "cpu"):
            raise NetShapeError(f"job traffic kind must be 'gpu' or 'cpu', got {kind!r}")
        if multi_node and kind != "gpu":
            raise NetShapeError(f"job {job_id}: only GPU jobs are tracked as multi-node")
        job = NetJob(job_id, kind, target, bool(multi_node))
        self._jobs[job_id] = job
        if self._active and not self._needed():
            # A re-announced job is no longer multi-node and was the only one.
            self._deactivate(reason=f"job {job_id} is no longer multi-node")
        elif self._active:
            self.classifier.classify(job_id, target, kind)
        elif self._needed():
            self._activate(trigger=job_id)

    def job_ended(self, job_id: str) -> None:
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        if not self._active:
            return
        if self._needed():
            self.classifier.unclassify(job_id)
        else:
            self._deactivate(reason=f"last multi-node GPU job {job_id} ended")

    def close(self) -> None:
        """noded is stopping: leave the NIC as it was found."""
        if self._active:
            self._deactivate(reason="noded stopping")
        self.classifier.close()

    def _needed(self) -> bool:
        return any(j.kind == "gpu" and j.multi_node for j in self._jobs.values())

    def _activate(self, *, trigger: str) -> None:
        self.shaper.install()
        self._active = True
        log.info(
            "netshape partition on ifname=%s trigger=%s jobs=%d",
            self.shaper.ifname,
            trigger,
            len(self._jobs),
        )
        failed = []
        for job in self._jobs.values():
            try:
                self.classifier.classify(job.job_id, job.target, job.kind)
            except NetShapeError as exc:
                # One job that cannot be classified (exited, no own cgroup) must not leave the
                # others unshaped; its traffic falls into the "other" class.
                failed.append(job.job_id)
                log.error("netshape classify failed job=%s error=%s", job.job_id, exc)
        if failed:
            raise NetShapeError(
                f"partition installed, but jobs {', '.join(failed)} could not be classified"
            )

    def _deactivate(self, *, reason: str) -> None:
        for job_id in list(self.classifier.jobs()):
            self.classifier.unclassify(job_id)
        self.shaper.remove()
        self._active = False
        log.info("netshape partition off ifname=%s reason=%s", self.shaper.ifname, reason)
