"""The demo's narrated timeline: what the master reports, told as it happens.

``Timeline`` prints one timestamped sentence per line (seconds since the scenes began) and
keeps them. ``Narrator`` polls the master — the journal (``events``), ``jobs``, ``services``
with each one's ``place`` answer, ``profiles`` — and turns what changed into sentences: a job
that runs, ends, is preempted or throttled; a service whose mode or replicas changed; a
profiling campaign fitted. Nothing it says comes from the scenes' intentions: a scene says
what it asks the master for, the narrator what the master then did. It keeps everything it
read, for the summary and for ``--record``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from control.aclient import AsyncMasterClient
from control.client import RpcError, Unreachable

log = logging.getLogger("trellis.demo")

ENDED = ("finished", "failed", "cancelled", "timeout", "node_lost")
# Journal rows that add nothing a reader of the timeline needs: the running/ended rows tell it.
QUIET = frozenset({"submitted", "placed", "part_started", "part_exited", "cancel_requested",
                   "launch_failed", "metric", "queued", "stop_requested"})


@dataclass
class Timeline:
    """Timestamped sentences, printed as they come."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)
    lines: list[tuple[float, str, str]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def since_start(self, wall: float) -> float:
        """Seconds since the scenes began for a time the master reported (epoch seconds)."""
        return wall - self.wall0

    def say(self, scene: str, text: str, at: float | None = None) -> None:
        t = self.now() if at is None else at
        self.lines.append((t, scene, text))
        print(f"{t:6.1f}s  {scene:<9} {text}", file=self.out, flush=True)


def where(job: dict[str, Any]) -> str:
    """``n1 GPUs 0-3`` / ``n2 core 1``: a job's placement in few words."""
    parts = []
    for p in job.get("placement") or []:
        node = short(p["node"])
        if p["gpus"]:
            parts.append(f"{node} GPU{'s' if len(p['gpus']) > 1 else ''} "
                         f"{','.join(str(g) for g in p['gpus'])}")
        else:
            cores = p["cpus"]
            parts.append(f"{node} core{'s' if len(cores) > 1 else ''} "
                         f"{','.join(str(c) for c in cores)}")
    return " + ".join(parts) or "?"


def short(node: str) -> str:
    """``trellis-demo-n3`` -> ``n3``."""
    return node.rsplit("-", 1)[-1] if "-" in node else node


@dataclass
class Narrator:
    client: AsyncMasterClient
    timeline: Timeline
    # job id -> the scene that asked for it; replicas and profiling runs are found by kind.
    cast: dict[str, str] = field(default_factory=dict)
    period_s: float = 0.4
    events: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)  # the latest place
    service_log: list[dict[str, Any]] = field(default_factory=list)
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    placements: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # first ones
    submitted_seq: dict[str, int] = field(default_factory=dict)
    placed_seq: dict[str, int] = field(default_factory=dict)  # first placement
    _cursor: int = 0
    _said: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # Scenes poll too, to read what happened up to now: one poll at a time.
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def scene_of(self, job: dict[str, Any]) -> str:
        if job["id"] in self.cast:
            return self.cast[job["id"]]
        if job.get("kind") == "inference":
            return "inference"
        if self.profile_run(job["id"]) is not None:
            return "genie"
        return "-"

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set, then once more so the last events are told."""
        while True:
            stopping = stop.is_set()
            try:
                await self.poll()
            except (Unreachable, RpcError) as exc:
                log.debug("narrator poll failed: %s", exc)
            if stopping:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period_s)

    async def poll(self) -> None:
        async with self._lock:
            await self._poll()

    async def _poll(self) -> None:
        new: list[dict[str, Any]] = []
        while True:
            reply = await self.client.call("events", {"after": self._cursor, "limit": 500})
            new.extend(reply["events"])
            self._cursor = reply["last"]
            if len(reply["events"]) < 500:
                break
        # After the events, so every job they name is listed.
        self.jobs = {j["id"]: j for j in (await self.client.call("jobs"))["jobs"]}
        self.profiles = {p["id"]: p for p in (await self.client.call("profiles"))["profiles"]}
        for event in new:
            self.events.append(event)
            self.tell(event)
        for svc in (await self.client.call("services"))["services"]:
            place = await self.client.call("place", {"service": svc["service"]})
            self.services[svc["service"]] = place
            self.tell_service(place)

    # -- sentences ------------------------------------------------------------------------
    def tell(self, e: dict[str, Any]) -> None:
        kind, job_id = e["kind"], e["job"]
        if kind == "submitted":
            self.submitted_seq.setdefault(job_id, e["seq"])
        elif kind == "placed":
            self.placed_seq.setdefault(job_id, e["seq"])
            self.placements[job_id] = e["detail"]["placement"]
        if kind in QUIET:
            return
        at = self.timeline.since_start(e["time"])
        detail = e.get("detail") or {}
        job = self.jobs.get(job_id or "", {"id": job_id, "name": job_id})
        name = job.get("name") or job_id
        run = self.profile_run(job_id)
        if run is not None:
            name = (f"profiling run {job_id} (<{run['d_node']},{run['d_gpn']}>, batch "
                    f"{run['batch']})")
        scene = self.scene_of(job) if job_id else "-"
        say = self.timeline.say
        if kind == "running":
            if run is not None:
                say(scene, f"{name} runs on {where(job)}", at)
                return
            placed = where({"placement": self.placements.get(job_id)})
            if job.get("kind") == "inference":
                say(scene, f"replica {name} runs on {placed}", at)
                return
            text = f"{name} runs on {placed}"
            if job.get("kind") == "cpu":
                text = f"{name} (CPU job) runs on {placed}"
            ahead = self.overtaken(job)
            if ahead:
                text += f", ahead of {', '.join(ahead)} (submitted earlier, not yet started)"
            say(scene, text, at)
        elif kind == "finished":
            ran = ""
            if job.get("start_time") and job.get("end_time"):
                ran = f" after {job['end_time'] - job['start_time']:.1f} s"
            say(scene, f"{name} finished{ran}", at)
        elif kind == "failed":
            say(scene, f"{name} FAILED: exit {detail.get('exit_code')} "
                       f"signal {detail.get('signal')} {detail.get('reason', '')}".rstrip(), at)
        elif kind == "timeout":
            say(scene, f"{name} stopped at its time limit: {detail.get('reason', '')}", at)
        elif kind == "warned":
            say(scene, f"{name} warned with {detail.get('signal')} "
                       f"{detail.get('seconds')} s before its time limit", at)
        elif kind == "cancelled":
            what = "replica retired" if job.get("kind") == "inference" else "cancelled"
            say(scene, f"{name}: {what}", at)
        elif kind == "preempted":
            say(scene, f"{name} PREEMPTED and re-queued at the head of its array: "
                       f"{detail.get('reason', '')}", at)
        elif kind == "contention":
            action = str(detail.get("action"))
            what = {"mba": "throttled: MBA", "cores": "throttled: cores",
                    "restore_mba": "restored: MBA", "restore_cores": "restored: cores"}
            unit = "%" if action.endswith("mba") else ""
            say("contention", f"{short(e['node'] or '?')}: {name} "
                              f"{what.get(action, action)} {detail.get('previous')}{unit} -> "
                              f"{detail.get('value')}{unit} ({detail.get('reason', '')})", at)
        elif kind == "cores_changed":
            say(scene, f"{name}: cores now {detail}", at)
        elif kind == "profile_started":
            say("genie", f"profiling campaign for {detail.get('model_type')} on "
                         f"{detail.get('gpu_model')}: {detail.get('runs')} real runs", at)
        elif kind == "profile_fitted":
            say("genie", f"fitted {detail.get('model_type')}: sPR(b) = {detail.get('k0', 0):.1f}"
                         f" + {detail.get('k1', 0):.2f} b {detail.get('k2', 0):+.4f} b^2 "
                         f"samples/s per GPU, gamma {detail.get('gamma', 0):.2f}, lambda "
                         f"{detail.get('lam', 0):.2f}; fit error "
                         f"{100 * detail.get('single_gpu_error', 0):.1f}% (1 GPU), "
                         f"{100 * detail.get('placement_error', 0):.1f}% (placements)", at)
        elif kind == "models_loaded":
            say("genie", f"the model database now holds {', '.join(detail.get('models', []))} "
                         f"(from {detail.get('origin')}); predictions use it from the next "
                         f"pass", at)
        elif kind == "profile_failed":
            say("genie", f"profiling FAILED: {detail.get('error')}", at)
        else:
            subject = name if job_id else short(e.get("node") or "cluster")
            say(scene, f"{subject}: {kind} {detail if detail else ''}".rstrip(), at)

    def profile_run(self, job_id: str | None) -> dict[str, Any] | None:
        for campaign in self.profiles.values():
            for run in campaign["runs"]:
                if run["job_id"] == job_id:
                    return dict(run)
        return None

    def overtaken(self, job: dict[str, Any]) -> list[str]:
        """Jobs of the same scene and size class submitted before ``job`` whose first
        placement the journal had not yet recorded when ``job``'s was."""
        mine = self.placed_seq.get(job["id"])
        submitted = self.submitted_seq.get(job["id"])
        if not job.get("gpus") or mine is None or submitted is None:
            return []
        large = job["gpus"] >= 4
        out = []
        for other_id, seq in sorted(self.submitted_seq.items(), key=lambda x: x[1]):
            other = self.jobs.get(other_id)
            if (other is None or other_id == job["id"] or seq >= submitted
                    or not other.get("gpus") or (other["gpus"] >= 4) != large
                    or self.cast.get(other_id) != self.cast.get(job["id"])):
                continue
            if self.placed_seq.get(other_id, mine + 1) > mine:
                out.append(other["name"])
        return out

    def tell_service(self, place: dict[str, Any]) -> None:
        ready = [e for e in place["endpoints"] if e["ready"]]
        counts = {k: sum(1 for e in ready if e["kind"] == k) for k in ("cpu", "gpu")}
        key = (place["mode"], counts["cpu"], counts["gpu"])
        name = place["service"]
        if self._said.get(name) == key:
            return
        before = self._said.get(name)
        self._said[name] = key
        self.service_log.append({"t": self.timeline.now(), "mode": place["mode"],
                                 "load": place["load"], **counts})
        parts = [f"{n} {k.upper()}" for k, n in counts.items() if n]
        text = f"{name} at load {place['load']:g}: "
        text += (f"{' + '.join(parts)} replica(s) ready" if parts else "no replica ready yet")
        if before is not None and before[0] != place["mode"]:
            text += f"; mode {before[0].upper()} -> {place['mode'].upper()}"
        self.timeline.say("inference", text)
