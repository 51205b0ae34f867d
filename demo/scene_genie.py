"""GENIE in the demo: a profiling campaign fits a new model type from real runs, then SWAF
orders a queue of QoS classes with the fitted model (seeds/genie.md §5.1.5, §5.4).

The SWAF queue waits in SODA's large-job array, which holds one node: its jobs take the whole
node, so they run one at a time and the order SWAF chose is the order they run in. A job with
a deadline, submitted after two normal jobs, starts before them because its waiting allowance
(deadline minus predicted latency minus now) is smaller.
"""

from __future__ import annotations

import time
from typing import Any

from demo.stage import GAMMA, LAMBDA, MODEL_TYPE, TRUTH, SceneResult, SceneTimeout, Stage

PROFILE = "genie"
SWAF = "swaf"
BATCHES = (8, 16, 24, 32)
DEADLINE_S = 16.0  # the deadline job's, from its submission


async def profile(stage: Stage) -> SceneResult:
    """A B + N + G campaign: 4 batch sizes on one GPU, <1,2> and <2,1> at batch 32."""
    stage.say(PROFILE, f"profiling the new model type {MODEL_TYPE}: single-GPU runs at batch "
                       f"{', '.join(map(str, BATCHES))}, then <1,2> and <2,1> at batch 32; each "
                       f"run is a real job reporting samples/s on the metrics channel")
    started = time.monotonic()
    reply = await stage.client.call("profile", {
        "model_type": MODEL_TYPE, "user": stage.user,
        "command": stage.emulated("{batch}", "{iterations}", report_s=0.15),
        "batches": list(BATCHES), "global_batch": 32, "iterations": 10, "max_nodes": 2,
        "max_gpus_per_node": 2, "cpus_per_gpu": 0, "family": "cnn", "params_m": 25.0,
    })
    campaign_id = reply["profile"]["id"]
    for run in reply["profile"]["runs"]:
        stage.narrator.cast[run["job_id"]] = PROFILE

    async def settled() -> dict[str, Any] | None:
        c = (await stage.client.call("profiles", {"id": campaign_id}))["profiles"][0]
        return c if c["state"] != "running" else None

    try:
        campaign = await stage.until("the profiling campaign", settled, 90)
    except SceneTimeout as exc:
        return SceneResult("GENIE profiling", "a fitted model", str(exc), ok=False)
    took = time.monotonic() - started
    stage.cue("profiled").set()
    runs = campaign["runs"]
    if campaign["state"] != "fitted":
        return SceneResult("GENIE profiling", "a fitted model",
                           f"campaign {campaign['state']}: {campaign['error']}", ok=False)
    fit = campaign["fit"]
    errors = [abs(_spr(fit, b) / _spr_truth(b) - 1) for b in BATCHES]
    return SceneResult(
        "GENIE profiling",
        f"{len(runs)} real runs fitted {MODEL_TYPE}; SWAF predicts with it from the next pass",
        f"campaign {took:.1f} s; fit error {100 * fit['single_gpu_error']:.2f}% (1 GPU), "
        f"{100 * (fit['placement_error'] or 0):.2f}% (placements); sPR within "
        f"{100 * max(errors):.1f}% of the emulated truth at b=8..32; gamma "
        f"{fit['gamma']:.2f} (truth {GAMMA:g}), lambda {fit['lam']:.2f} (truth {LAMBDA:g})")


def _spr(fit: dict[str, float], b: float) -> float:
    return fit["k0"] + fit["k1"] * b + fit["k2"] * b * b


def _spr_truth(b: float) -> float:
    k0, k1, k2 = TRUTH[:3]
    return k0 + k1 * b + k2 * b * b


async def swaf(stage: Stage) -> SceneResult:
    """Five jobs of three QoS classes behind a running one in the one-node large array."""
    title = "SWAF QoS ordering"
    gpus = stage.sizes.get("large", 0)
    if gpus < 4:
        return SceneResult(title, "not run", f"the large-job array has {gpus} GPUs (needs a "
                           f"node of 4 or more)", ok=False)

    def spec(name: str, qos: str, iterations: int, **extra: Any) -> dict[str, Any]:
        return {"name": name, "kind": "training", "gpus": gpus, "cpus": 0, "max_nodes": 1,
                "qos": qos, "tenant": "research", "model_type": MODEL_TYPE, "batch": 64,
                "iterations": iterations, "command": stage.emulated(64, iterations), **extra}

    stage.say(SWAF, f"pretrain takes the whole large-job array ({gpus} GPUs); five jobs queue "
                    f"behind it: bert-a, bert-b (normal), vit (prior), t5 (normal, deadline in "
                    f"{DEADLINE_S:g} s), gpt (urgent), in that order")
    blocker = await stage.submit(SWAF, spec("pretrain", "normal", 40))
    try:
        running = await stage.until("pretrain to run",
                                    lambda: stage.states([blocker], ("running",)), 60)
    except SceneTimeout as exc:
        return SceneResult(title, "not shown", str(exc), ok=False)
    stage.large_nodes.update(running[blocker]["nodes"])
    stage.cue("large_busy").set()
    names = ["bert-a", "bert-b", "vit", "t5", "gpt"]
    ids = [
        await stage.submit(SWAF, spec("bert-a", "normal", 16)),
        await stage.submit(SWAF, spec("bert-b", "normal", 16)),
        await stage.submit(SWAF, spec("vit", "prior", 16)),
        await stage.submit(SWAF, spec("t5", "normal", 16, deadline=time.time() + DEADLINE_S)),
        await stage.submit(SWAF, spec("gpt", "urgent", 16)),
    ]
    predictions = {i: (await stage.job(i)).get("prediction") or {} for i in ids}
    now = time.time()
    lines = []
    for i, name in sorted(zip(ids, names, strict=True),
                          key=lambda x: _allowance(predictions[x[0]])):
        p = predictions[i]
        if p.get("waiting_allowance_s") is None:
            lines.append(f"{name} (no prediction)")
            continue
        lines.append(f"{name} w={p['waiting_allowance_s']:.1f}s")
    stage.say(SWAF, "the master's SWAF order (waiting allowance w = ECT - predicted latency - "
                    "now): " + ", ".join(lines))
    p = predictions[ids[0]]
    if p.get("predicted_latency_s") is not None:
        stage.say(SWAF, f"bert-a: predicted {p['predicted_latency_s']:.1f} s on "
                        f"<{p['placement']['d_node']},{p['placement']['d_gpn']}> with the "
                        f"{'fallback' if p['fallback'] else 'profiled'} model, ECT in "
                        f"{p['ect'] - now:.1f} s")
    try:
        jobs = await stage.until("the SWAF queue to finish",
                                 lambda: stage.states([blocker, *ids], ("finished", "failed",
                                                                         "cancelled")), 120)
    except SceneTimeout as exc:
        return SceneResult(title, "not shown", str(exc), ok=False)
    return _swaf_result(title, names, ids, jobs, predictions)


def _allowance(p: dict[str, Any]) -> float:
    w = p.get("waiting_allowance_s")
    return float("inf") if w is None else float(w)


def _swaf_result(title: str, names: list[str], ids: list[str], jobs: dict[str, Any],
                 predictions: dict[str, Any]) -> SceneResult:
    by_id = dict(zip(ids, names, strict=True))
    ran = [i for i in ids if jobs[i]["start_time"] is not None]
    order = sorted(ran, key=lambda i: jobs[i]["start_time"])
    t5, bert_a = jobs[ids[3]], jobs[ids[0]]
    overtook = (t5["start_time"] is not None and bert_a["start_time"] is not None
                and t5["start_time"] < bert_a["start_time"])
    met, judged = 0, 0
    for i in ids:
        p, j = predictions[i], jobs[i]
        if j["qos"] == "urgent" or p.get("ect") is None or j["end_time"] is None:
            continue  # urgent: as soon as possible, no ECT to meet
        judged += 1
        met += j["end_time"] <= p["ect"]
    figures = f"start order {' > '.join(by_id[i] for i in order)}; "
    if overtook:
        figures += (f"t5, submitted after bert-a and bert-b, started "
                    f"{bert_a['start_time'] - t5['start_time']:.1f} s before bert-a; ")
    figures += f"ECT met {met}/{judged} (urgent: as soon as possible)"
    failed = [by_id[i] for i in ids if jobs[i]["state"] != "finished"]
    if failed:
        figures += f"; did not finish: {', '.join(failed)}"
    return SceneResult(title, "urgent first, then the deadline job ahead of earlier normal "
                       "jobs" if overtook else "the deadline job did NOT overtake", figures,
                       ok=overtook and not failed)
