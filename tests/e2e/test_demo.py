"""``./run demo`` end to end: the demo runs every scene, and the master's journal shows each one
happened — read straight from the SQLite journal the demo's master wrote, not from what the
demo printed.

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
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest

from demo.cluster import TREE


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
    returncode: int
    out: str
    journal: Journal
    record: dict[str, Any]
    prefix: str


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
def demo_run(tmp_path: Path) -> Iterator[DemoRun]:
    prefix = f"trellis-test-demo-{uuid.uuid4().hex[:6]}"
    record = tmp_path / "record.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo.run", "--keep", "--record", str(record), "--prefix",
         prefix], cwd=TREE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    root: Path | None = None
    try:
        try:
            out, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the demo's own clean-up
            out, _ = proc.communicate(timeout=60)
            pytest.fail("the demo took more than 150 s:\n" + out[-6000:])
        line = next((x for x in out.splitlines() if x.startswith("state and logs kept in ")),
                    None)
        assert line, out[-6000:]
        root = Path(line.removeprefix("state and logs kept in "))
        assert record.exists(), out[-6000:]
        yield DemoRun(proc.returncode, out, read_journal(root / "master" / "master.db"),
                      json.loads(record.read_text()), prefix)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stale in Path("/tmp").glob(f"{prefix}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


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


def test_the_demo_shows_every_scene(demo_run: DemoRun) -> None:
    journal, record, out = demo_run.journal, demo_run.record, demo_run.out
    assert demo_run.returncode == 0, out[-8000:]
    assert "5/5 scenes shown" in out, out[-8000:]
    # A narrated timeline and a summary table.
    assert "SCENE" in out and "SODA contention eliminator" in out
    assert record["wall_s"] < 120, record["wall_s"]
    # It cleaned up after itself (--keep kept only the directory, for this test to read).
    assert not leftovers(demo_run.prefix)

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
