"""SODA's multi-array pools in the demo (§V-C): CPU jobs run in their own array while every
GPU is taken and GPU jobs wait.

The cores of each GPU node are split into a GPU-job array and a CPU-job array; a CPU job
queues only for the latter, so a busy GPU side never holds it up (and it never takes the cores
GPU jobs need). The scene fills every GPU — the SWAF queue holds the large array; training
jobs of two GPUs (one where a node has a single GPU left) fill the small one, and one more is
left waiting — and then submits two ETL jobs. Whether every GPU was allocated when they started
is read back from the journal, not assumed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from demo.stage import SceneResult, SceneTimeout, Stage

SCENE = "arrays"
ETL_S = 4.0
ENDS = ("finished", "failed", "cancelled", "timeout", "node_lost", "preempted")


def gpus_in_use(events: Iterable[dict[str, Any]], upto_seq: int) -> int:
    """GPUs allocated just after journal row ``upto_seq``, replaying placements and ends."""
    held: dict[str, int] = {}
    for e in events:
        if e["seq"] > upto_seq:
            break
        if e["kind"] == "placed":
            held[e["job"]] = sum(len(p["gpus"]) for p in e["detail"]["placement"])
        elif e["kind"] in ENDS:
            held.pop(e["job"], None)
    return sum(held.values())


def gpu_jobs_waiting(events: Iterable[dict[str, Any]], upto_seq: int,
                     gpu_jobs: set[str]) -> list[str]:
    """GPU jobs submitted (or preempted) and not placed again by journal row ``upto_seq``."""
    waiting: set[str] = set()
    for e in events:
        if e["seq"] > upto_seq:
            break
        if e["job"] in gpu_jobs:
            if e["kind"] in ("submitted", "preempted"):
                waiting.add(e["job"])
            elif e["kind"] in ("placed", "finished", "failed", "cancelled"):
                waiting.discard(e["job"])
    return sorted(waiting)


def pools_line(pools: dict[str, Any]) -> str:
    return ", ".join(f"{a['name'].split(':')[0]} {a['used']}/{a['size']} {a['unit']}"
                     + (f" ({a['queued']} waiting)" if a["queued"] else "")
                     for a in pools["arrays"])


async def small_free(stage: Stage) -> dict[str, int]:
    """Free GPUs per node outside the large-job array."""
    nodes = (await stage.client.call("nodes"))["nodes"]
    return {n["name"]: n["gpus_free"] for n in nodes
            if n["status"] == "ready" and n["name"] not in stage.large_nodes}


async def fill(stage: Stage) -> list[str]:
    """Training jobs until no GPU outside the large array is free and one of them waits."""
    ids: list[str] = []

    async def submit(gpus: int) -> None:
        ids.append(await stage.submit(SCENE, {
            "name": f"yolo-{len(ids) + 1}", "kind": "training", "gpus": gpus, "cpus": 0,
            "qos": "normal", "tenant": "vision",
            # About 12 s either way at the demo model's rates.
            "command": stage.emulated(64, 40 if gpus == 2 else 24)}))

    async def placed_or_full() -> bool:
        jobs = await stage.jobs()
        return (all(jobs[i]["state"] != "queued" for i in ids)
                or not sum((await small_free(stage)).values()))

    for _ in range(5):
        free = await small_free(stage)
        jobs = await stage.jobs()
        if not sum(free.values()):
            if any(jobs[i]["state"] == "queued" for i in ids):
                return ids
            await submit(2)  # the one that waits
        else:
            pairs, singles = sum(f // 2 for f in free.values()), sum(f % 2 for f in free.values())
            stage.say(SCENE, f"{sum(free.values())} GPUs free outside the large-job array: "
                             f"submitting {pairs} 2-GPU and {singles} 1-GPU training jobs")
            for gpus in [2] * pairs + [1] * singles:
                await submit(gpus)
        await stage.until("the training jobs to be placed", placed_or_full, 20)
    return ids


async def cpu_array(stage: Stage) -> SceneResult:
    title = "SODA CPU-job array"
    # The large array is busy with the SWAF queue, the service runs on GPUs: now fill the rest.
    for cue in ("large_busy", "gpu_mode"):
        await stage.wait_cue(SCENE, cue, 60)
    try:
        fillers = await fill(stage)
    except SceneTimeout as exc:
        stage.cue("gpus_full").set()  # nobody should wait for it now
        return SceneResult(title, "not shown", str(exc), ok=False)
    pools = await stage.client.call("pools")
    stage.say(SCENE, f"pools now: {pools_line(pools)}")
    stage.say(SCENE, "submitting two ETL jobs (CPU only, 1 core each)")
    etl = [await stage.submit(SCENE, {
        "name": name, "kind": "cpu", "gpus": 0, "cpus": 1, "tenant": "etl",
        "command": ["sh", "-c", f"sleep {ETL_S:g}; echo {name} done"]})
        for name in ("etl-a", "etl-b")]
    try:
        await stage.until("the ETL jobs to start",
                          lambda: stage.states(etl, ("running", "finished", "failed")), 30)
    except SceneTimeout as exc:
        return SceneResult(title, "ETL jobs did not start", str(exc), ok=False)
    finally:
        stage.cue("gpus_full").set()  # the inference surge comes next
    try:
        await stage.until("the ETL jobs to finish",
                          lambda: stage.states(etl, ("finished", "failed", "cancelled")), 60)
    except SceneTimeout as exc:
        return SceneResult(title, "ETL jobs did not finish", str(exc), ok=False)
    await stage.narrator.poll()
    jobs = stage.narrator.jobs
    events = stage.narrator.events
    total = sum(n["gpus"] for n in (await stage.client.call("nodes"))["nodes"])
    gpu_jobs = {i for i, j in jobs.items() if j.get("gpus")}
    starts = {e["job"]: e["seq"] for e in events if e["kind"] == "placed" and e["job"] in etl}
    if len(starts) < len(etl):
        return SceneResult(title, "not shown", "the journal has no placement of an ETL job",
                           ok=False)
    at_start = [(gpus_in_use(events, seq), gpu_jobs_waiting(events, seq, gpu_jobs))
                for seq in starts.values()]
    shown = all(used == total and waiting for used, waiting in at_start)
    waits = [jobs[i]["queued_s"] or 0.0 for i in etl]
    waiting = {jobs[w]["name"] for _, names in at_start for w in names}
    figures = (f"ETL queueing {', '.join(f'{w:.1f}' for w in waits)} s; GPUs allocated at "
               f"their start {', '.join(f'{u}/{total}' for u, _ in at_start)}, GPU jobs "
               f"waiting then: {', '.join(sorted(waiting)) or 'none'}; "
               f"{len(fillers)} fillers")
    return SceneResult(
        title,
        "CPU jobs started at once in the CPU-job array while every GPU was allocated and "
        "GPU jobs waited" if shown else "the ETL jobs ran, but GPUs were not all busy then",
        figures, ok=shown)
