"""trellisctl's start-up: each run of a simple command against the bare interpreter, same run.

    python bench/cli_startup.py [--runs 40] [--submits 100] [--tree DIR]

Starts a real trellis-masterd with one drained node (submissions are journalled and queue)
and times,
interleaved run by run so a busy machine slows both alike:

- ``python -c pass`` with the same interpreter: the floor every Python program pays;
- ``trellisctl -o json jobs`` (parse, connect, one RPC, print) and ``trellisctl --help``;
- ``--submits`` sequential ``trellisctl submit`` runs, as the issue measured them against
  ``sbatch`` (jobs/s).

``--tree DIR`` runs trellisctl from another checkout (e.g. ``git worktree add /tmp/old HEAD~3``)
to compare before and after on the same machine. The target is ``jobs`` in at most 80 ms on
a machine whose interpreter starts in 50 ms: a ratio of 1.6. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, scratch_dir  # noqa: E402

TARGET_RATIO = 80 / 50  # the 80 ms against its interpreter's 50 ms


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.decode()[-2000:]}")
    return elapsed


def ms(values: list[float]) -> dict[str, float]:
    return {"median_ms": round(1000 * statistics.median(values), 2),
            "p10_ms": round(1000 * statistics.quantiles(values, n=10)[0], 2),
            "min_ms": round(1000 * min(values), 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=40, help="runs of each command")
    p.add_argument("--submits", type=int, default=100, help="sequential submits (0: none)")
    p.add_argument("--tree", type=Path, default=ROOT, help="checkout whose trellisctl runs")
    args = p.parse_args()
    tree = args.tree.resolve()
    # The checkout's code first on the path, run as operators run it: the console script
    # (its `from control.cli import main` finds the checkout through PYTHONPATH).
    env = dict(os.environ, PYTHONPATH=str(tree))
    # An installed trellisctl runs from bytecode compiled at install time (build-deb.sh runs
    # compileall). A shell with PYTHONDONTWRITEBYTECODE would make every run compile every
    # module it imports: the children get a bytecode cache of their own instead.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    script = Path(sys.executable).with_name("trellisctl")
    ctl = [sys.executable, str(script)] if script.exists() else [sys.executable, "-m",
                                                                 "control.cli"]
    with exit_on_signals(), scratch_dir("trellis-test-bench-cli-") as root, \
            LocalCluster(root / "c", nodes=1, gpus_per_node=1,
                         prefix="trellis-bench-cli") as cluster:
        cluster.start()
        cluster.client().call("drain", {"node": cluster.node_name(1)})
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        for warm in ([sys.executable, "-c", "pass"], [*ctl, "--help"],
                     [*ctl, "--master", cluster.url, "-o", "json", "jobs"]):
            timed(warm, env, tree)  # fills the cache
        bare: list[float] = []
        jobs: list[float] = []
        helps: list[float] = []
        for _ in range(args.runs):
            bare.append(timed([sys.executable, "-c", "pass"], env, tree))
            jobs.append(timed([*ctl, "--master", cluster.url, "-o", "json", "jobs"], env, tree))
            helps.append(timed([*ctl, "--help"], env, tree))
        submit_s = 0.0
        if args.submits:
            started = time.perf_counter()
            for i in range(args.submits):
                timed([*ctl, "--master", cluster.url, "submit", "--user", default_job_user(),
                       "--name", f"s{i}", "--cpus", "1", "--", "true"], env, tree)
            submit_s = time.perf_counter() - started
    floor = statistics.median(bare)
    result = {
        "tree": str(tree),
        "runs": args.runs,
        "python_pass": ms(bare),
        "trellisctl_jobs": ms(jobs),
        "trellisctl_help": ms(helps),
        "jobs_ratio": round(statistics.median(jobs) / floor, 3),
        "help_ratio": round(statistics.median(helps) / floor, 3),
        "target_ratio": round(TARGET_RATIO, 3),
        "jobs_ms_scaled_to_50ms_interpreter": round(50 * statistics.median(jobs) / floor, 1),
        "submits": args.submits,
        "submit_jobs_per_s": round(args.submits / submit_s, 1) if submit_s else None,
    }
    result["meets_target"] = result["jobs_ratio"] <= TARGET_RATIO
    print(f"python -c pass {result['python_pass']['median_ms']} ms; trellisctl -o json jobs "
          f"{result['trellisctl_jobs']['median_ms']} ms (x{result['jobs_ratio']}); --help "
          f"{result['trellisctl_help']['median_ms']} ms; {args.submits} sequential submits: "
          f"{result['submit_jobs_per_s']} jobs/s", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
