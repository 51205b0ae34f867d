"""The same batch scripts under real Slurm (sbatch, Debian's 22.05 on loopback:
tests/e2e/slurmlocal.py) and under Trellis (trellisctl submit, real daemons): what each job
printed (its output file, named by the script's ``--output``) and how each ended.

Cases: an array (``--array``, ``%a`` files, ``SLURM_ARRAY_TASK_ID``), a dependency chain
(afterok, afterany, afterok on a failed job), a time limit with a warning signal
(``--signal B:USR1@N``), a cancelled job, and a job printing its rank variables. Everything is
submitted to both at once and compared when all have ended: the time limit case sets the
module's pace, as Slurm's time limits are whole minutes checked every 30 s (about 90 s here);
Trellis runs the same script with a shorter ``-t``/``--signal`` on the command line (options
there override the script's, as with sbatch).

State mapping compared: COMPLETED = finished, FAILED = failed (same exit code), TIMEOUT =
timeout, CANCELLED = cancelled. What is not the same and why (docs/slurm.md): the ranks case
runs one task per node in Trellis (2 nodes, the script on each) and two tasks through srun on
Slurm's one node (one slurmd: Debian's Slurm is not built for several per host), so the rank
lines are compared, not the scripts; Slurm's own "slurmstepd: error: *** JOB ... CANCELLED"
line in a killed job's file is left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from demo.cluster import LocalCluster, default_job_user
from demo.harness import scratch_dir
from tests.e2e.slurmlocal import LocalSlurm, missing_binaries
from tests.unit.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
USER = default_job_user()
SLURM_ENDED = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY",
               "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
TRELLIS_ENDED = {"finished", "failed", "cancelled", "timeout", "node_lost"}
STATE_MAP = {"COMPLETED": "finished", "FAILED": "failed", "TIMEOUT": "timeout",
             "CANCELLED": "cancelled"}

pytestmark = pytest.mark.skipif(bool(missing_binaries()) or os.geteuid() != 0,
                                reason=f"needs root and Slurm/munge binaries (missing: "
                                       f"{', '.join(missing_binaries()) or 'none'})")

SCRIPTS = {
    "sweep.sh": """#!/bin/bash
#SBATCH --job-name=sweep
#SBATCH --array=0-2
#SBATCH --output=sweep-%a.out
#SBATCH --time=5
#SBATCH --cpus-per-task=1
echo "task $SLURM_ARRAY_TASK_ID, array set: ${SLURM_ARRAY_JOB_ID:+yes}"
echo "square $((SLURM_ARRAY_TASK_ID * SLURM_ARRAY_TASK_ID))"
""",
    "prep.sh": """#!/bin/bash
#SBATCH -J prep -o prep.out
echo "prepared $1" > data.txt
echo "prep wrote data.txt"
""",
    "train.sh": """#!/bin/bash
#SBATCH -J train
#SBATCH -o train.out
echo "train read: $(cat data.txt)"
""",
    "broken.sh": """#!/bin/bash
#SBATCH -J broken -o broken.out
echo "about to fail" >&2
exit 3
""",
    "report.sh": """#!/bin/sh
#SBATCH -J report -o report.out
echo "report after broken"
""",
    "never.sh": """#!/bin/sh
#SBATCH -J never -o never.out
echo "never printed"
""",
    "limit.sh": """#!/bin/bash
#SBATCH --job-name=limit
#SBATCH --time=1
#SBATCH --signal=B:USR1@50
#SBATCH --output=limit.out
trap 'echo "warned with USR1"' USR1
echo "started"
while true; do sleep 0.5; done
""",
    "long.sh": """#!/bin/bash
#SBATCH -J long -o long.out
echo "waiting to be cancelled"
while true; do sleep 0.5; done
""",
    "ranks-slurm.sh": """#!/bin/bash
#SBATCH --job-name=ranks --nodes=1 --ntasks=2 --output=ranks.out
srun bash -c 'echo "rank $SLURM_PROCID of $SLURM_NTASKS"'
""",
    "ranks.sh": """#!/bin/bash
#SBATCH --job-name=ranks --nodes=2 --gpus-per-node=1 --output=ranks.out
echo "rank $SLURM_PROCID of $SLURM_NTASKS"
""",
}


@dataclass
class Side:
    """One system's runs: job ids by case and where its jobs wrote."""

    dir: Path
    ids: dict[str, list[str]] = field(default_factory=dict)
    states: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # (state, exit)


@dataclass
class Runs:
    slurm: Side
    trellis: Side
    cluster: LocalCluster


def ctl(cluster: LocalCluster, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRELLIS_", "SLURM_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "control.cli", "--master", cluster.url,
                           *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env)


def trellis_submit(cluster: LocalCluster, cwd: Path, script: str, *options: str) -> list[str]:
    r = ctl(cluster, cwd, "-o", "json", "submit", "--user", USER, *options,
            str(cwd / script), *(["x"] if script == "prep.sh" else []))
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    return [j["id"] for j in result["jobs"]] if "jobs" in result else [result["job"]["id"]]


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    tag = uuid.uuid4().hex[:6]
    with scratch_dir("trellis-test-sbs-", mode=0o777) as root:
        slurm = LocalSlurm(root / "slurm-daemons", f"trellis-test-slurm-{tag}")
        (root / "slurm-daemons").mkdir(mode=0o755)
        with LocalCluster(root / "c", nodes=2, gpus_per_node=1,
                          prefix=f"trellis-test-sbs{tag}") as cluster:
            try:
                slurm.start()
                cluster.start()
                yield _run_all(slurm, cluster, root)
            finally:
                slurm.stop()


def _run_all(slurm: LocalSlurm, cluster: LocalCluster, root: Path) -> Runs:
    sides = Runs(Side(root / "slurm"), Side(root / "trellis"), cluster)
    for side in (sides.slurm, sides.trellis):
        side.dir.mkdir(mode=0o777)
        side.dir.chmod(0o777)
        for name, text in SCRIPTS.items():
            (side.dir / name).write_text(text)
    s, t = sides.slurm, sides.trellis

    def sbatch(case: str, script: str, *options: str) -> str:
        args = ("x",) if script == "prep.sh" else ()
        job = slurm.sbatch(s.dir / script, *args, cwd=s.dir, options=options)
        s.ids.setdefault(case, []).append(job)
        return job

    def submit(case: str, script: str, *options: str) -> str:
        jobs = trellis_submit(cluster, t.dir, script, *options)
        t.ids.setdefault(case, []).extend(jobs)
        return jobs[0]

    # The slowest first: Slurm's time limit takes a minute and a half.
    sbatch("limit", "limit.sh")
    submit("limit", "limit.sh", "-t", "0:08", "--signal", "B:USR1@5")
    sbatch("sweep", "sweep.sh")
    submit("sweep", "sweep.sh")
    for side_submit in (sbatch, submit):  # the same command line on both
        prep = side_submit("chain", "prep.sh")
        side_submit("chain", "train.sh", "-d", f"afterok:{prep}")
        broken = side_submit("chain", "broken.sh")
        side_submit("chain", "report.sh", "-d", f"afterany:{broken}")
        side_submit("chain", "never.sh", "-d", f"afterok:{broken}")
    sbatch("ranks", "ranks-slurm.sh")
    submit("ranks", "ranks.sh")
    slurm_long = sbatch("cancel", "long.sh")
    trellis_long = submit("cancel", "long.sh")
    client = cluster.client(timeout=30)
    wait_for(lambda: (s.dir / "long.out").exists() and (t.dir / "long.out").exists()
             and client.call("job", {"id": trellis_long})["job"]["state"] == "running",
             60, "the long jobs to run", interval=0.3)
    subprocess.run(["scancel", slurm_long], env=slurm.env, check=True, timeout=30)
    assert ctl(cluster, t.dir, "cancel", trellis_long).returncode == 0

    def slurm_state(job: str) -> list[tuple[str, str]]:
        records = slurm.jobs(job)
        return [(r.get("JobState", "?"), r.get("ExitCode", "?").split(":")[0])
                for r in records]

    def trellis_state(job: str) -> tuple[str, str]:
        view = client.call("job", {"id": job})["job"]
        return view["state"], str(view.get("exit_code"))

    def all_ended() -> bool:
        done = True
        for case, jobs in s.ids.items():
            s.states[case] = [st for j in jobs for st in slurm_state(j)]
            done &= all(st in SLURM_ENDED for st, _ in s.states[case])
        for case, jobs in t.ids.items():
            t.states[case] = [trellis_state(j) for j in jobs]
            done &= all(st in TRELLIS_ENDED for st, _ in t.states[case])
        return done

    try:
        wait_for(all_ended, 180, "every job on both systems to end", interval=0.3)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: Slurm {s.states}, Trellis {t.states}") from None
    return sides


def output(side: Side, name: str) -> list[str]:
    lines = (side.dir / name).read_text().splitlines()
    return [line for line in lines if not line.startswith("slurmstepd")]


def states(side: Side, case: str, slurm: bool) -> list[str]:
    found = [STATE_MAP.get(st, st) if slurm else st for st, _ in side.states[case]]
    return found


def test_array_prints_the_same_per_task(runs: Runs) -> None:
    for index in range(3):
        name = f"sweep-{index}.out"
        assert output(runs.trellis, name) == output(runs.slurm, name) == [
            f"task {index}, array set: yes", f"square {index * index}"]
    assert states(runs.slurm, "sweep", True) == states(runs.trellis, "sweep", False) == \
        ["finished"] * 3


def test_dependency_chain_ends_the_same(runs: Runs) -> None:
    for name, lines in (("prep.out", ["prep wrote data.txt"]),
                        ("train.out", ["train read: prepared x"]),
                        ("broken.out", ["about to fail"]),
                        ("report.out", ["report after broken"])):
        assert output(runs.trellis, name) == output(runs.slurm, name) == lines, name
    assert not (runs.slurm.dir / "never.out").exists()
    assert not (runs.trellis.dir / "never.out").exists()
    expected = ["finished", "finished", "failed", "finished", "cancelled"]
    assert states(runs.slurm, "chain", True) == states(runs.trellis, "chain", False) == \
        expected
    # The failed job's exit code on both.
    assert runs.slurm.states["chain"][2][1] == runs.trellis.states["chain"][2][1] == "3"


def test_time_limit_warns_then_times_out(runs: Runs) -> None:
    assert output(runs.trellis, "limit.out") == output(runs.slurm, "limit.out") == [
        "started", "warned with USR1"]
    assert states(runs.slurm, "limit", True) == states(runs.trellis, "limit", False) == \
        ["timeout"]


def test_cancelled(runs: Runs) -> None:
    assert output(runs.trellis, "long.out") == output(runs.slurm, "long.out") == [
        "waiting to be cancelled"]
    assert states(runs.slurm, "cancel", True) == states(runs.trellis, "cancel", False) == \
        ["cancelled"]


def test_rank_variables(runs: Runs) -> None:
    assert sorted(output(runs.trellis, "ranks.out")) == sorted(output(runs.slurm, "ranks.out")) \
        == ["rank 0 of 2", "rank 1 of 2"]
    assert states(runs.slurm, "ranks", True) == states(runs.trellis, "ranks", False) == \
        ["finished"]
    # Trellis' two tasks were on two nodes, each with its part of the job's log.
    (job,) = runs.trellis.ids["ranks"]
    client = runs.cluster.client()
    view = client.call("job", {"id": job})["job"]
    assert len({p["node"] for p in view["placement"]}) == 2
