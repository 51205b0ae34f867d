"""``./run demo --serve`` end to end: the demo runs every scene, and the master's journal shows
each one happened — read straight from the SQLite journal the demo's master wrote, not from
what the demo printed; then the ``trellisctl`` commands it prints work against the cluster it
leaves running, and Ctrl-C stops that cluster and leaves no process or cgroup behind.

* SWAF: the deadline job, submitted after two normal jobs, was placed before them; the urgent
  job, submitted last, was placed first of the queue.
* SODA arrays: an ETL job was placed while every GPU was allocated and a GPU job waited, and
  CPU jobs and GPU jobs never shared a core (the CPU-job array is its own).
* Inference placer: CPU replicas, then GPU replicas (three at once at the peak, one of them by
  preempting a training job), replicas retired, and a CPU replica again at the end.
* Contention: the memory-hungry job was throttled with MBA (and restored).
* GENIE: the profiling campaign was fitted and its model stored.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest

from demo.cluster import TREE
from tests.e2e.test_bench_interrupt import cgroups, heed_stop_signals


@dataclass
class Journal:
    events: list[dict[str, Any]]  # oldest first
    specs: dict[str, dict[str, Any]]  # job id -> spec
    profiles: list[dict[str, Any]]
    models: list[str]

    def first(self, kind: str, job: str) -> int | None:
        return next((e["seq"] for e in self.events if e["kind"] == kind and e["job"] == job),
                    None)

    def named(self, name: str) -> str:
        ids = [i for i, s in self.specs.items() if s.get("name") == name]
        assert len(ids) == 1, (name, ids)
        return ids[0]


def read_journal(db_path: Path) -> Journal:
    db = sqlite3.connect(db_path)
    try:
        events = [{"seq": seq, "job": job, "node": node, "kind": kind,
                   "detail": json.loads(detail)}
                  for seq, job, node, kind, detail in db.execute(
                      "SELECT seq, job_id, node, kind, detail FROM events ORDER BY seq")]
        specs = {i: msgpack.unpackb(spec) for i, spec in db.execute("SELECT id, spec FROM jobs")}
        profiles = [json.loads(d) for (d,) in db.execute("SELECT data FROM genie_profiles")]
        models = [m for (m,) in db.execute("SELECT model_type FROM genie_models")]
    finally:
        db.close()
    return Journal(events, specs, profiles, models)


@dataclass
class DemoRun:
    proc: subprocess.Popen[bytes]
    output: Path
    record: Path
    prefix: str

    def out(self) -> str:
        return self.output.read_text(errors="replace")


def leftovers(prefix: str) -> list[str]:
    """Processes of the demo still alive: its daemons and shims name its directory, its jobs
    carry TRELLIS_NODE=<prefix>-nN."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(prefix in arg for arg in info["cmdline"] or ()) or \
                (info["environ"] or {}).get("TRELLIS_NODE", "").startswith(prefix):
            found.append(" ".join(info["cmdline"] or ()))
    return found


@pytest.fixture
def serving_demo(tmp_path: Path) -> Iterator[DemoRun]:
    """``python -m demo.run --serve`` once its scenes are over and it prints how to use it."""
    prefix = f"trellis-test-demo-{uuid.uuid4().hex[:6]}"
    output = tmp_path / "output"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "demo.run", "--serve", "--keep", "--record",
             str(tmp_path / "record.json"), "--prefix", prefix], cwd=TREE, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=heed_stop_signals)
    run = DemoRun(proc, output, tmp_path / "record.json", prefix)
    try:
        deadline = time.monotonic() + 150
        while "Stop it with Ctrl-C" not in run.out():
            if run.proc.poll() is not None:
                pytest.fail(f"the demo exited with {run.proc.returncode}:\n{run.out()[-8000:]}")
            if time.monotonic() > deadline:
                pytest.fail("the demo took more than 150 s:\n" + run.out()[-8000:])
            time.sleep(0.5)
        yield run
    finally:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)  # the demo's own clean-up
            try:
                run.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
        for left in Path(tempfile.gettempdir()).glob(f"{prefix}-*"):
            shutil.rmtree(left, ignore_errors=True)


def ctl(env: dict[str, str], *args: str) -> Any:
    """trellisctl -o json ARGS with the environment the demo told us to export."""
    proc = subprocess.run([sys.executable, "-m", "control.cli", "-o", "json", *args],
                          capture_output=True, text=True, timeout=60, cwd=TREE,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def gpus_held(journal: Journal, upto: int) -> tuple[int, set[str]]:
    """GPUs allocated just after journal row ``upto``, and the GPU jobs waiting then."""
    held: dict[str, int] = {}
    waiting: set[str] = set()
    for e in journal.events:
        if e["seq"] > upto:
            break
        job = e["job"]
        gpu_job = bool(journal.specs.get(job or "", {}).get("gpus"))
        if e["kind"] == "placed":
            held[job] = sum(len(p["gpus"]) for p in e["detail"]["placement"])
            waiting.discard(job)
        elif e["kind"] in ("finished", "failed", "cancelled", "preempted"):
            held.pop(job, None)
            if e["kind"] == "preempted" and gpu_job:
                waiting.add(job)
            else:
                waiting.discard(job)
        elif e["kind"] == "submitted" and gpu_job:
            waiting.add(job)
    return sum(held.values()), waiting


def test_the_demo_shows_every_scene_then_serves_until_ctrl_c(serving_demo: DemoRun) -> None:
    out = serving_demo.out()
    record = json.loads(serving_demo.record.read_text())
    # A narrated timeline and a summary table.
    assert "5/5 scenes shown" in out, out[-8000:]
    assert "SCENE" in out and "SODA contention eliminator" in out
    assert record["wall_s"] < 120, record["wall_s"]
    root = Path(record["root"])
    journal = read_journal(root / "master" / "master.db")

    # --serve: the commands it prints work against the cluster, with its URL and token.
    exports = next(x for x in out.splitlines() if x.strip().startswith("export "))
    env = dict(word.split("=", 1) for word in exports.split()[1:] if word.startswith("TRELLIS_"))
    assert env["TRELLIS_MASTER"] == record["url"] and Path(env["TRELLIS_TOKEN_FILE"]).exists()
    listed = {j["name"] for j in ctl(env, "jobs")["jobs"]}
    assert {"t5", "gpt", "etl-stream", "etl-a"} <= listed, listed
    assert ctl(env, "profiles")["profiles"][0]["state"] == "fitted"

    # -- GENIE: fitted from real runs, stored ----------------------------------------------
    assert [p["state"] for p in journal.profiles] == ["fitted"], journal.profiles
    campaign = journal.profiles[0]
    assert all(r["state"] == "done" and r["rate"] for r in campaign["runs"]), campaign["runs"]
    assert any(e["kind"] == "profile_fitted" for e in journal.events)
    assert "demo-resnet" in journal.models

    # -- SWAF: urgent first, the deadline job ahead of the earlier normal ones -------------
    placed = {n: journal.first("placed", journal.named(n))
              for n in ("pretrain", "bert-a", "bert-b", "vit", "t5", "gpt")}
    submitted = {n: journal.first("submitted", journal.named(n)) for n in placed}
    assert all(placed.values()), placed
    assert journal.specs[journal.named("t5")]["deadline"] is not None
    assert submitted["bert-a"] < submitted["bert-b"] < submitted["t5"] < submitted["gpt"]
    assert placed["t5"] < placed["bert-a"] and placed["t5"] < placed["bert-b"], placed
    queue = ("bert-a", "bert-b", "vit", "t5", "gpt")
    assert min(queue, key=lambda n: placed[n]) == "gpt", placed

    # -- SODA arrays: an ETL job placed while every GPU was allocated and GPU jobs waited --
    total = record["sizes"]["large"] + record["sizes"]["small"]
    etl = [journal.named("etl-a"), journal.named("etl-b")]
    moments = [gpus_held(journal, journal.first("placed", j) or 0) for j in etl]
    assert any(used == total and waiting for used, waiting in moments), moments
    # CPU jobs and GPU jobs never shared a core of a node: the CPU-job array is its own.
    cores: dict[tuple[str, int], set[str]] = {}
    for e in journal.events:
        if e["kind"] == "placed":
            kind = "gpu" if journal.specs[e["job"]].get("gpus") else "cpu"
            for p in e["detail"]["placement"]:
                for core in p["cpus"]:
                    cores.setdefault((p["node"], core), set()).add(kind)
    assert cores and all(len(kinds) == 1 for kinds in cores.values()), cores
    assert any(kinds == {"cpu"} for kinds in cores.values())

    # -- Inference: CPU -> GPU (3 at the peak, one by preemption) -> CPU --------------------
    replicas = [e for e in journal.events if e["kind"] == "placed"
                and journal.specs[e["job"]].get("kind") == "inference"]
    kinds = ["gpu" if any(p["gpus"] for p in e["detail"]["placement"]) else "cpu"
             for e in replicas]
    assert kinds[:2] == ["cpu", "cpu"] and "gpu" in kinds and kinds[-1] == "cpu", kinds
    first_gpu = kinds.index("gpu")
    assert kinds[first_gpu:first_gpu + 3] == ["gpu"] * 3, kinds
    live, most = set(), 0
    for e in journal.events:
        job = e["job"]
        if job in {r["job"] for r in replicas}:
            gpu = bool(journal.specs[job].get("gpus"))
            if e["kind"] == "placed" and gpu:
                live.add(job)
            elif e["kind"] in ("cancelled", "finished", "failed"):
                live.discard(job)
            most = max(most, len(live))
    assert most == 3, most
    retired = [e for e in journal.events if e["kind"] == "cancelled"
               and journal.specs[e["job"]].get("kind") == "inference"]
    assert len(retired) >= 4, retired  # 2 CPU at the switch, 1 GPU scaling in, 2 GPU at the end
    preempted = [e for e in journal.events if e["kind"] == "preempted"]
    assert any("inference service resnet-serve" in e["detail"]["reason"] for e in preempted)

    # -- Contention: the memory-hungry job throttled with MBA, then restored ----------------
    hungry = journal.named("etl-stream")
    actions = [e["detail"]["action"] for e in journal.events
               if e["kind"] == "contention" and e["job"] == hungry]
    assert "mba" in actions, actions
    assert "restore_mba" in actions[actions.index("mba"):], actions

    # Ctrl-C: the cluster goes, jobs, cgroups and all (--keep keeps only the directory).
    serving_demo.proc.send_signal(signal.SIGINT)
    assert serving_demo.proc.wait(60) == 0, serving_demo.out()[-3000:]
    assert "demo cluster stopped" in serving_demo.out()
    assert not leftovers(serving_demo.prefix)
    assert not cgroups(serving_demo.prefix)
