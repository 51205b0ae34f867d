"""Bulk submission end to end: ``trellisctl submit --array 0-999`` against one ``trellisctl
submit`` of a single job, same run, same master.

    python bench/bulk_submit.py [--jobs 1000] [--rounds 5]

Starts a real trellis-masterd (journal on disk, synchronous=FULL) with one real node daemon,
drained so the jobs are journalled and queued but not launched, and times whole trellisctl
processes (start-up, reading the options, building the jobs, the one ``submit_many`` round
trip, printing): an ``--array`` of ``--jobs`` jobs and a file of as many ``[[jobs]]``, each
``--rounds`` times, alternating with single-job submits as the baseline. It also reads the
master's journal transaction counter around each bulk submission: one transaction per batch
is the group commit doing its job. Target (issue #24): 1,000 jobs in at most 2 s. Last line:
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, scratch_dir  # noqa: E402

TARGET_S = 2.0


def transactions(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "trellis_journal_transactions":
            return next(s.value for s in family.samples if s.name.endswith("_total"))
    raise RuntimeError("the master exports no trellis_journal_transactions_total")


def run(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:8])} ... failed: {proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000, help="jobs per bulk submission")
    p.add_argument("--rounds", type=int, default=5, help="bulk submissions of each kind")
    args = p.parse_args()
    user = default_job_user()
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: from compiled bytecode
    script = Path(sys.executable).with_name("trellisctl")
    ctl = [sys.executable, str(script)] if script.exists() else [sys.executable, "-m",
                                                                 "control.cli"]
    times: dict[str, list[float]] = {"array": [], "file": [], "single": []}
    commits: list[float] = []
    with exit_on_signals(), scratch_dir("trellis-test-bench-bulk-") as root, \
            LocalCluster(root / "c", nodes=1, gpus_per_node=1,
                         prefix="trellis-bench-bulk") as cluster:
        cluster.start()
        cluster.client().call("drain", {"node": cluster.node_name(1)})
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        base = [*ctl, "--master", cluster.url, "-o", "json"]
        run([*base, "jobs"], env)  # fills the bytecode cache
        for r in range(args.rounds):
            before = transactions(cluster.url)
            elapsed, out = run([*base, "submit", "--array", f"0-{args.jobs - 1}", "--name",
                                f"arr{r}", "--cpus", "1", "--user", user, "--", "true"], env)
            commits.append(transactions(cluster.url) - before)
            if len(json.loads(out)["jobs"]) != args.jobs:
                raise RuntimeError("the array reply does not list every job")
            times["array"].append(elapsed)
            path = root / f"jobs{r}.json"
            path.write_text(json.dumps({"user": user, "cpus": 1, "kind": "cpu", "jobs": [
                {"name": f"file{r}-{i}", "command": ["true"]} for i in range(args.jobs)]}))
            elapsed, _ = run([*base, "submit", "-f", str(path)], env)
            times["file"].append(elapsed)
            for i in range(3):
                elapsed, _ = run([*base, "submit", "--name", f"one{r}-{i}", "--cpus", "1",
                                  "--user", user, "--", "true"], env)
                times["single"].append(elapsed)
    array_s = statistics.median(times["array"])
    single_s = statistics.median(times["single"])
    result = {
        "jobs": args.jobs,
        "rounds": args.rounds,
        "array_s": round(array_s, 3),
        "array_max_s": round(max(times["array"]), 3),
        "file_s": round(statistics.median(times["file"]), 3),
        "single_submit_s": round(single_s, 4),
        "array_vs_single_ratio": round(array_s / single_s, 2),
        "array_jobs_per_s": round(args.jobs / array_s),
        "transactions_per_array": commits,
        "target_s": TARGET_S,
        "meets_target": max(times["array"]) <= TARGET_S,
    }
    print(f"{args.jobs} jobs: --array {result['array_s']} s (worst {result['array_max_s']} s), "
          f"-f {result['file_s']} s; one job {result['single_submit_s']} s; transactions per "
          f"array {commits}", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
