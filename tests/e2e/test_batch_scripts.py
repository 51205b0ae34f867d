"""``trellisctl submit script.sh`` end to end on real daemons (no Slurm needed): the script
travels with the job and runs under its shebang's interpreter from the job's directory, its
output files are written on the node as the job's user and hold what ``trellisctl logs``
shows, its Slurm variables are there; bad scripts are refused in one sentence with no job
created, by the CLI and (for SDK callers) by the master."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from control.client import RpcError
from demo.cluster import LocalCluster, default_job_user
from demo.harness import scratch_dir

ROOT = Path(__file__).resolve().parents[2]
USER = default_job_user()
ENDED = {"finished", "failed", "cancelled", "timeout", "node_lost"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with scratch_dir("trellis-test-sbatch-", mode=0o777) as root, \
            LocalCluster(root / "c", nodes=1, gpus_per_node=1,
                         prefix="trellis-test-sbatch") as c:
        c.start()
        yield c


@pytest.fixture
def work(cluster: LocalCluster, request: pytest.FixtureRequest) -> Path:
    """A directory the jobs (run as USER) write into, and the CLI runs from."""
    import uuid

    path = cluster.root.parent / f"{request.node.originalname}-{uuid.uuid4().hex[:6]}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


def ctl(cluster: LocalCluster, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRELLIS_", "SLURM_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "control.cli", "--master", cluster.url, *args],
        capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def job_count(cluster: LocalCluster) -> int:
    return len(cluster.client().call("jobs")["jobs"])


def wait_end(cluster: LocalCluster, job: str) -> dict:  # type: ignore[type-arg]
    client = cluster.client()
    view: dict = cluster.wait_for(  # type: ignore[type-arg]
        f"{job} to end", lambda: (v := client.call("job", {"id": job})["job"])["state"]
        in ENDED and v, timeout=60)
    return view


def test_script_runs_with_its_files_variables_and_logs(cluster: LocalCluster,
                                                       work: Path) -> None:
    (work / "train.sh").write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=train -o out-%j-%x.txt --error=err-%j.txt\n"
        "#SBATCH --time=5:00 --cpus-per-task=1\n"
        "# an ordinary comment does not end the header\n"
        "#TRELLIS --env MODE=test\n"
        "echo \"args: $# [$1] [$2]\"\n"
        "echo \"script: $(stat -c '%a %U' \"$0\") in $(basename \"$(dirname \"$0\")\")\"\n"
        "echo \"pwd: $PWD submit: $SLURM_SUBMIT_DIR\"\n"
        "echo \"ids: $SLURM_JOB_ID=$TRELLIS_JOB_ID name: $SLURM_JOB_NAME mode: $MODE\"\n"
        "echo \"ranks: $SLURM_PROCID/$SLURM_NTASKS nodes: $SLURM_JOB_NUM_NODES\"\n"
        "echo to-stderr >&2\n"
        "#SBATCH --partition=ignored-after-the-first-command\n")
    r = ctl(cluster, work, "-o", "json", "submit", "--user", USER, "train.sh", "one",
            "two words")
    assert r.returncode == 0, r.stderr
    assert "line 12: #SBATCH after the first command is ignored" in r.stderr
    job = json.loads(r.stdout)["job"]["id"]
    view = wait_end(cluster, job)
    assert view["state"] == "finished", view
    out = (work / f"out-{job}-train.txt").read_text()
    assert out.splitlines() == [
        "args: 2 [one] [two words]",
        f"script: 700 {USER} in {job}",
        f"pwd: {work} submit: {work}",
        f"ids: {job}={job} name: train mode: test",
        "ranks: 0/1 nodes: 1"]
    assert (work / f"err-{job}.txt").read_text() == "to-stderr\n"
    # Written on the node as the job's user.
    assert (work / f"out-{job}-train.txt").stat().st_uid == pwd.getpwnam(USER).pw_uid
    # trellisctl logs shows both streams, the same bytes.
    logs = ctl(cluster, work, "logs", job)
    assert logs.returncode == 0, logs.stderr
    assert sorted(logs.stdout.splitlines()) == sorted([*out.splitlines(), "to-stderr"])


def test_default_output_file_and_a_file_the_user_cannot_write(cluster: LocalCluster,
                                                             work: Path) -> None:
    (work / "hello").write_text("#!/bin/sh\necho hello from $SLURM_JOB_NAME\n")
    r = ctl(cluster, work, "-o", "json", "submit", "--user", USER, "./hello")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["job"]["id"]
    assert wait_end(cluster, job)["state"] == "finished"
    assert (work / f"slurm-{job}.out").read_text() == "hello from hello\n"  # sbatch's default
    # The user may not write there: the job fails saying which file, as Slurm's would.
    locked = work / "locked"
    locked.mkdir(mode=0o755)
    r = ctl(cluster, work, "-o", "json", "submit", "--user", USER, "--stdout",
            f"{locked}/o.txt", "./hello")
    job = json.loads(r.stdout)["job"]["id"]
    view = wait_end(cluster, job)
    assert view["state"] == "failed" and f"cannot open the output file {locked}/o.txt" in \
        view["reason"], view
    assert not (locked / "o.txt").exists()


@pytest.mark.parametrize("content, words", [
    ("echo no shebang\n", "has no shebang (#!) on its first line"),
    ("#!/bin/sh\n#SBATCH -o out-%t.txt\necho\n", "line 2: -o=out-%t.txt: "),
    ("#!/bin/sh\n#SBATCH -J a\n#SBATCH --licenses=db --mail-user=x\n",
     "does not support --licenses (line 3), --mail-user (line 3)"),
    ("#!/bin/sh\n#SBATCH --time=soon\n", "line 2: --time=soon: "),
])
def test_bad_scripts_are_refused_in_one_sentence_and_no_job_is_made(
        cluster: LocalCluster, work: Path, content: str, words: str) -> None:
    (work / "bad.sh").write_text(content)
    before = job_count(cluster)
    r = ctl(cluster, work, "submit", "--user", USER, "bad.sh")
    assert r.returncode == 2
    assert words in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert job_count(cluster) == before


def test_not_a_file_missing_or_unreadable(cluster: LocalCluster, work: Path) -> None:
    (work / "dir.sh").mkdir()
    before = job_count(cluster)
    # A regular file nobody can read, root included (reading it fails with EIO); a
    # permission refusal is tests/unit/test_sbatch.py's.
    for args, words in ((["dir.sh"], "is a directory"),
                        (["missing.sh"], "no such batch script"),
                        (["/proc/self/mem"], "cannot read the batch script /proc/self/mem")):
        r = ctl(cluster, work, "submit", "--user", USER, *args)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert job_count(cluster) == before
    # --ignore-unsupported submits, saying what it ignored; the old form is untouched.
    (work / "extra.sh").write_text("#!/bin/sh\n#SBATCH --licenses=db\necho ok\n")
    r = ctl(cluster, work, "submit", "--user", USER, "--ignore-unsupported", "extra.sh")
    assert r.returncode == 0 and "ignoring unsupported --licenses (line 2)" in r.stderr
    r = ctl(cluster, work, "submit", "--user", USER, "--", "true")
    assert r.returncode == 0, r.stderr
    assert job_count(cluster) == before + 2


def test_master_refuses_what_the_cli_would_for_sdk_callers(cluster: LocalCluster) -> None:
    client = cluster.client()
    before = job_count(cluster)
    base = {"name": "sdk", "command": ["x.sh"], "user": USER, "kind": "cpu", "cpus": 1}
    for launch, words in (({"script": "echo hi\n"}, "no shebang"),
                          ({"stdout": "o-%q"}, "%q, an unknown pattern")):
        with pytest.raises(RpcError) as err:
            client.call("submit", {"job": {**base, "launch": launch}})
        assert words in err.value.message, err.value.message
    assert job_count(cluster) == before
