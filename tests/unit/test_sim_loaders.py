"""Workload loaders: the shared traces as they are, and malformed rows named by file:line."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from shared.model import JobKind, QosClass
from sim.cluster import NodeGroup, build_cluster
from sim.truth import TruthModel
from sim.workloads import genie, jobfile, openb, philly, sacct
from sim.workloads.assign import MODEL_TYPES
from sim.workloads.base import LoadOptions, TraceError

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
if not TRACES.is_dir():
    TRACES = Path("/work/shared/traces")
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"no shared traces at {TRACES}")

TRUTH = TruthModel()
NODES = build_cluster([NodeGroup(count=2, gpus_per_node=4, prefix="f")])


def philly_dir(tmp_path: Path, rows: list[str] | None = None, head: int = 200) -> Path:
    """A trace directory with the real VC file and the first ``head`` Philly jobs (+ rows)."""
    (tmp_path / philly.VCS_FILE).write_text((TRACES / philly.VCS_FILE).read_text())
    with (TRACES / philly.JOBS_FILE).open() as src:
        lines = list(islice(src, head + 1))
    lines += [r + "\n" for r in rows or []]
    (tmp_path / philly.JOBS_FILE).write_text("".join(lines))
    return tmp_path


@needs_traces
def test_philly_subset_loads_with_seeded_fill_ins(tmp_path: Path) -> None:
    trace = philly_dir(tmp_path)
    workload = philly.load(trace, LoadOptions(seed=4), TRUTH)
    again = philly.load(trace, LoadOptions(seed=4), TRUTH)
    other = philly.load(trace, LoadOptions(seed=5), TRUTH)
    assert len(workload.jobs) == 200
    assert workload.jobs[0].submit == 0.0
    assert [j.submit for j in workload.jobs] == sorted(j.submit for j in workload.jobs)
    assert workload.notes["gpus"] == 352 * 8 and len(workload.nodes) == 352
    assert {j.spec.model_type for j in workload.jobs} <= set(MODEL_TYPES)
    assert all(j.spec.kind is JobKind.TRAINING and j.spec.gpus >= 1 for j in workload.jobs)
    assert [j.spec for j in workload.jobs] == [j.spec for j in again.jobs]
    assert [j.spec.qos for j in workload.jobs] != [j.spec.qos for j in other.jobs]
    qos = [j.spec.qos for j in workload.jobs]
    assert qos.count(QosClass.NORMAL) > qos.count(QosClass.PRIOR) > qos.count(QosClass.URGENT)
    # The first job of the file: 2017-10-09 07:01:55, 66 s on 1 GPU in VC 11cb48.
    first = next(j for j in workload.jobs if j.id == "philly-000002")
    assert first.truth.known_duration == 66.0 and first.spec.tenant == "11cb48"


@needs_traces
@pytest.mark.parametrize(
    "bad_row, message",
    [
        ("2017-10-09 07:01:55,abc,1,66.0,11cb48", "duration"),
        ("2017-10-09 07:01:55,66.0,0,0.0,11cb48", "num_gpus"),
        ("2017-10-09 07:01:55,66.0,2,66.0,11cb48", "gpu_time"),
        ("yesterday,66.0,1,66.0,11cb48", "timestamp"),
        ("2017-10-09 07:01:55,66.0,1,66.0", "expected 5 fields"),
        ("2017-10-09 07:01:55,66.0,1,66.0,bad vc!", "cluster"),
        ("2017-10-09 07:01:55,nan,1,66.0,11cb48", "finite"),
    ],
)
def test_philly_malformed_row_names_file_and_line(
    tmp_path: Path, bad_row: str, message: str
) -> None:
    trace = philly_dir(tmp_path, [bad_row], head=5)
    with pytest.raises(TraceError) as err:
        philly.load(trace, LoadOptions(), TRUTH)
    assert err.value.line == 7  # header + 5 rows, then the bad one
    assert f"{philly.JOBS_FILE}:7:" in str(err.value)
    assert message in str(err.value)


@needs_traces
def test_philly_skip_bad_rows_reports_them(tmp_path: Path) -> None:
    trace = philly_dir(tmp_path, ["x,1,1,1,11cb48", "2017-10-09 07:01:55,5,1,5,11cb48"], head=5)
    workload = philly.load(trace, LoadOptions(skip_bad_rows=True), TRUTH)
    assert len(workload.jobs) == 6
    assert len(workload.skipped) == 1 and ":7:" in workload.skipped[0]
    assert workload.notes["skipped_rows"] == 1


def test_philly_missing_column_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / philly.VCS_FILE).write_text("vc,node num\nabc,2\n")
    (tmp_path / philly.JOBS_FILE).write_text("timestamp,duration,num_gpus\n")
    with pytest.raises(TraceError, match=r"philly-jobs.csv:1: missing column\(s\) gpu_time"):
        philly.load(tmp_path, LoadOptions(), TRUTH)
    with pytest.raises(TraceError, match="cannot open"):
        philly.load(tmp_path / "nowhere", LoadOptions(), TRUTH)
    (tmp_path / philly.VCS_FILE).write_text("vc,node num\nabc,zero\n")
    with pytest.raises(TraceError, match=r"philly-vcs.csv:2: column node num"):
        philly.load(tmp_path, LoadOptions(), TRUTH)


@needs_traces
def test_openb_loads_as_is_and_rounds_fractional_gpus_up() -> None:
    workload = openb.load(TRACES, LoadOptions(seed=1), TRUTH)
    assert len(workload.jobs) == 8152
    assert len(workload.nodes) == 1213
    # 3,078 pods ask for a fraction of one GPU: each gets one whole GPU.
    assert workload.notes["fractional_gpu_pods_rounded_up"] == 3078
    by_id = {j.id: j for j in workload.jobs}
    pod = by_id["openb-pod-0001"]  # 6000 milli-CPU, 1 GPU at 460 milli, LS
    assert (pod.spec.gpus, pod.spec.cpus, pod.spec.kind) == (1, 6, JobKind.INFERENCE)
    assert pod.spec.qos is QosClass.PRIOR and pod.spec.tenant == "ls"
    cpu_jobs = [j for j in workload.jobs if j.spec.kind is JobKind.CPU]
    assert len(cpu_jobs) == 1088 and all(j.spec.gpus == 0 for j in cpu_jobs)


OPENB_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                "creation_time,deletion_time,scheduled_time")


@pytest.mark.parametrize(
    "row, message",
    [
        ("p1,1000,10,1,1500,,LS,Running,0,10,0", "exceeds one whole GPU"),
        ("p1,1000,10,1,500,,XX,Running,0,10,0", "column qos"),
        ("p1,1000,10,1,500,,LS,Running,10,5,", "before creation_time"),
        ("p1,1000,10,1,500,,LS,Running,0,10,20", "scheduled_time"),
        ("p1,0,10,0,0,,BE,Running,0,10,0", "neither CPU nor GPU"),
        ("p/1,1000,10,1,500,,LS,Running,0,10,0", "column name"),
    ],
)
def test_openb_malformed_pods(tmp_path: Path, row: str, message: str) -> None:
    (tmp_path / openb.GPU_NODES_FILE).write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nnode-a,8000,1000,2,T4\n")
    (tmp_path / openb.PODS_FILE).write_text(
        f"{OPENB_HEADER}\np0,1000,10,1,1000,,BE,Running,0,10,0\n{row}\n")
    with pytest.raises(TraceError, match=f"openb-pods.csv:3: .*{message}"):
        openb.load(tmp_path, LoadOptions(), TRUTH)


def test_openb_pod_runtime_rules(tmp_path: Path) -> None:
    (tmp_path / openb.GPU_NODES_FILE).write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nnode-a,8000,1000,2,T4\n")
    (tmp_path / openb.PODS_FILE).write_text(
        f"{OPENB_HEADER}\n"
        "ran,1500,10,1,250,,BE,Succeeded,100,700,300\n"
        "never,0,10,2,1000,T4,Guaranteed,Pending,200,260,\n")
    workload = openb.load(tmp_path, LoadOptions(), TRUTH)
    by_id = {j.id: j for j in workload.jobs}
    assert by_id["ran"].truth.known_duration == 400.0  # deletion − scheduled
    assert by_id["ran"].spec.cpus == 2 and by_id["ran"].spec.gpus == 1
    assert by_id["never"].truth.known_duration == 60.0  # deletion − creation
    assert by_id["never"].spec.gpu_model == "T4" and by_id["never"].spec.qos is QosClass.URGENT
    assert by_id["ran"].submit == 0.0 and by_id["never"].submit == 100.0


def test_job_file_csv_and_jsonl(tmp_path: Path) -> None:
    csv_path = tmp_path / "jobs.csv"
    csv_path.write_text(
        "name,user,tenant,submit,duration,gpus,cpus,qos,deadline\n"
        "a,alice,ml,2024-01-01T00:00:10,100,2,4,prior,2024-01-01T01:00:00\n"
        "b,bob,ml,2024-01-01T00:00:00,30,0,2,,\n")
    workload = jobfile.load(csv_path, LoadOptions(), NODES)
    assert [j.id for j in workload.jobs] == ["b", "a"]
    a = workload.jobs[1]
    assert a.submit == 10.0 and a.deadline == 3600.0
    assert a.spec.qos is QosClass.PRIOR and a.truth.known_duration == 100.0
    assert workload.jobs[0].spec.kind is JobKind.CPU

    jsonl = tmp_path / "jobs.jsonl"
    jsonl.write_text("\n".join(json.dumps(o) for o in (
        {"submit": 5, "gpus": 1, "model_type": "resnet50", "batch": 64, "iterations": 100},
        {"submit": 0, "gpus": 2, "duration": 50, "duration_gpus": 4, "kind": "inference"},
    )) + "\n")
    workload = jobfile.load(jsonl, LoadOptions(), NODES)
    model_job = workload.jobs[1]
    assert model_job.truth.iterations == 100 and model_job.truth.known_duration is None
    assert workload.jobs[0].truth.known_gpus == 4


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"submit": 1, "gpus": 1, "kind": "quantum", "duration": 5}', "kind"),
        ('{"submit": 1, "gpus": 1}', "either duration or both batch and iterations"),
        ('{"submit": 1, "gpus": 1, "duration": 5, "colour": "red"}', "unknown column"),
        ('{"submit": "2024-01-01T00:00:00", "gpus": 1, "duration": 5}', "mixes seconds"),
        ('{"submit": 1, "gpus": 1, "duration": 5, "user": "Root!"}', "user"),
        ('[1, 2]', "JSON object"),
        ('{"submit": 1, "gpus": 1, "duration": -5}', "negative"),
        ('{"submit": 1, "gpus": 1.5, "duration": 5}', "not an integer"),
    ],
)
def test_job_file_rejects_bad_lines_with_line_numbers(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"submit": 0, "gpus": 1, "duration": 5}\n\n' + line + "\n")
    with pytest.raises(TraceError, match=f"jobs.jsonl:3: .*{message}"):
        jobfile.load(path, LoadOptions(), NODES)
    workload = jobfile.load(path, LoadOptions(skip_bad_rows=True), NODES)
    assert len(workload.jobs) == 1 and ":3:" in workload.skipped[0]


def test_job_file_duplicate_ids(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("name,submit,duration,gpus\nx,0,1,1\nx,1,1,1\n")
    with pytest.raises(TraceError, match="job id x appears more than once"):
        jobfile.load(path, LoadOptions(), NODES)


SACCT = """JobID|User|Account|Submit|Start|End|State|AllocTRES
101|alice|vision|2024-03-01T10:00:00|2024-03-01T10:05:00|2024-03-01T12:05:00|COMPLETED|billing=8,cpu=8,gres/gpu:a100=2,mem=64G,node=1
102|bob|nlp|2024-03-01T10:01:00|Unknown|Unknown|PENDING|
103_4|bob|nlp|2024-03-01T10:02:00|2024-03-01T10:02:30|2024-03-01T10:12:30|FAILED|cpu=4,mem=512M,node=1
"""


def test_sacct_conversion(tmp_path: Path) -> None:
    source = tmp_path / "sacct.txt"
    source.write_text(SACCT)
    target = tmp_path / "jobs.csv"
    count, skipped = sacct.convert(source, target, LoadOptions())
    assert count == 2 and len(skipped) == 1 and "never started" in skipped[0]
    workload = jobfile.load(target, LoadOptions(), NODES)
    by_id = {j.id: j for j in workload.jobs}
    gpu_job = by_id["slurm-101"]
    assert (gpu_job.spec.gpus, gpu_job.spec.cpus, gpu_job.spec.memory_mib) == (2, 8, 65536)
    assert gpu_job.truth.known_duration == 7200.0 and gpu_job.spec.tenant == "vision"
    cpu_job = by_id["slurm-103_4"]
    assert cpu_job.spec.kind is JobKind.CPU and cpu_job.spec.memory_mib == 512
    source.write_text(SACCT.replace("cpu=4,mem", "cpu=four,mem"))
    with pytest.raises(TraceError, match=r"sacct\.txt:4: column AllocTRES"):
        sacct.convert(source, target, LoadOptions())


def test_genie_generator_follows_table3() -> None:
    workload = genie.generate(genie.GenieOptions(density=20, hours=24, seed=11))
    jobs = workload.jobs
    assert 380 < len(jobs) < 580  # Poisson(480)
    assert len(workload.nodes) == 4 and all(len(n.gpus) == 4 for n in workload.nodes)
    training = sum(j.spec.kind is JobKind.TRAINING for j in jobs) / len(jobs)
    assert 0.4 < training < 0.6
    urgent = sum(j.spec.qos is QosClass.URGENT for j in jobs) / len(jobs)
    prior = sum(j.spec.qos is QosClass.PRIOR for j in jobs) / len(jobs)
    assert urgent < 0.12 and 0.25 < prior < 0.45
    assert {j.spec.model_type for j in jobs} == set(MODEL_TYPES)
    assert max(j.submit for j in jobs) < 24 * 3600
    with pytest.raises(ValueError, match="positive"):
        genie.generate(genie.GenieOptions(density=0))
