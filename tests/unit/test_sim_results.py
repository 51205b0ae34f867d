"""`trellis-sim report` end to end on tiny traces, the per-VC replay and the report's rules."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from masterd.core.policies import make_policy
from sim import results
from sim.cli import main
from sim.engine import SimConfig, simulate
from sim.genie_profile import profile_platform
from sim.metrics import summarise
from sim.oracle import oracle_modeldb, prediction_errors
from sim.partition import simulate_partitioned, split_by_gpu_model
from sim.studies import REGISTRY
from sim.studies.common import ReportError, check_notes
from sim.tables import Spread, Table, fmt
from sim.truth import NodeTopology, TruthConfig, TruthModel
from sim.workloads import genie, openb, philly
from sim.workloads.assign import BATCHES
from sim.workloads.base import LoadOptions

SECTIONS = (
    "# Reproducing the papers, side by side",
    "## 1. GENIE workload",
    "## 2. Philly trace",
    "## 3. Cluster Energy Saving",
    "## 4. openb trace",
    "## 5. SCHED²",
    "## 7. Accounts and quotas",
)


def write_traces(root: Path) -> Path:
    """Tiny Philly and openb traces in the real files' formats."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "philly-vcs.csv").write_text("vc,node num\naaa111,2\nbbb222,1\n")
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    # VC aaa111 (16 GPUs, 8 at scale 0.5) gets a burst of long and short jobs; bbb222 a few;
    # one job from a VC without a size; one 16-GPU job that no longer fits at scale 0.5.
    for i in range(24):
        gpus = (1, 2, 4, 8)[i % 4]
        duration = 7200.0 if i % 3 == 0 else 300.0 + 50 * i
        lines.append(f"2017-10-02 0{i // 10}:{(i % 10) * 5:02d}:00,{duration},{gpus},"
                     f"{duration * gpus},aaa111")
    for i in range(6):
        lines.append(f"2017-10-02 01:{i * 7:02d}:00,{900.0 + i},{1 + i % 2},"
                     f"{(900.0 + i) * (1 + i % 2)},bbb222")
    lines.append("2017-10-02 01:00:00,600.0,1,600.0,ccc333")
    lines.append("2017-10-02 01:30:00,1200.0,16,19200.0,aaa111")
    lines.append("2017-09-20 01:30:00,1200.0,1,1200.0,aaa111")  # outside the window
    (root / "philly-jobs.csv").write_text("\n".join(lines) + "\n")
    (root / "openb-gpu-nodes.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "openb-node-0000,32000,131072,2,T4\n"
        "openb-node-0001,32000,131072,2,T4\n"
        "openb-node-0002,64000,262144,8,G2\n"
    )
    pods = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time"]
    for i in range(30):
        created = i * 120
        if i % 4 == 0:
            pods.append(f"openb-pod-{i:04d},8000,8192,0,0,,BE,Succeeded,{created},"
                        f"{created + 1500},{created}")
        else:
            gpus = 4 if i % 7 == 0 else 1
            qos = "BE" if i % 3 else "LS"  # BE GPU pods are training jobs (SODA's tuner)
            pods.append(f"openb-pod-{i:04d},4000,8192,{gpus},1000,,{qos},Running,{created},"
                        f"{created + 2400 + 60 * i},{created}")
    (root / "openb-pods.csv").write_text("\n".join(pods) + "\n")
    # Measured pairs sharing a GPU (Lucid's format) for the Liquid study's tiny run.
    coloc = [",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,model2,dataset2,gpu_num2,"
             "batchsize2,amp2,speed2,gpu_util,gmem_util,gmem"]
    for i in range(16):
        a, b = ("ResNet18", "VGG", "LSTM", "PPO")[i % 4], ("DCGAN", "TD3")[i % 2]
        coloc.append(f"{i},{a},CIFAR-10,1,{32 << (i % 3)},{i % 2},{0.6 + 0.02 * i:.3f},{b},"
                     f"LSUN,1,64,0,{0.9 - 0.01 * i:.3f},{40 + 3 * i},{20 + i},{3000 + 200 * i}")
    (root / "gpu-colocation.csv").write_text("\n".join(coloc) + "\n")
    # Five days of busy nodes every 10 minutes (a daily wave) for the CES study's tiny run.
    rows = ["time,active,total"]
    for step in range(5 * 144):
        stamp = 1506816000 + 600 * step  # 2017-10-01 00:00 UTC
        busy = 30 + round(20 * math.sin(2 * math.pi * step / 144))
        rows.append(f"{datetime.fromtimestamp(stamp, UTC):%Y-%m-%d %H:%M:%S},{busy},60")
    (root / "philly-node-sequence.csv").write_text("\n".join(rows) + "\n")
    return root


def write_notes(root: Path, text: str = "The tables above say what happened.") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for study in results.STUDIES:
        (root / f"{study}.md").write_text(f"{text} ({study})\n")
    return root


def markdown_tables(text: str) -> dict[str, list[list[str]]]:
    """Table id -> body rows (cells as text) from the generated Markdown."""
    tables: dict[str, list[list[str]]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        found = re.fullmatch(r"<!-- table: (\S+) -->", line)
        if not found:
            continue
        j = i + 1
        while not lines[j].startswith("|"):
            j += 1
        rows = []
        j += 2  # header and separator
        while j < len(lines) and lines[j].startswith("|"):
            rows.append([c.strip() for c in lines[j].strip("|").split(" | ")])
            j += 1
        tables[found.group(1)] = rows
    return tables


def cell_numbers(cell: object) -> list[float]:
    if cell is None or isinstance(cell, str):
        return []
    if isinstance(cell, dict):
        return [cell["mean"], cell["min"], cell["max"]]
    return [float(cell)]  # type: ignore[arg-type]


def decimals(spec: str) -> int:
    found = re.search(r"\.(\d+)f", spec)
    return int(found.group(1)) if found else 0


def assert_markdown_matches_json(text: str, document: dict) -> int:
    """Every table cell of the Markdown shows the JSON's value; returns the numbers checked."""
    md_tables = markdown_tables(text)
    json_tables = {t["id"]: t for s in document["studies"].values() for t in s["tables"]}
    checked = 0
    for table_id, table in json_tables.items():
        rows = md_tables[table_id]
        assert len(rows) == len(table["rows"]), table_id
        for md_row, json_row in zip(rows, table["rows"], strict=True):
            for md_cell, json_cell, spec in zip(md_row, json_row, table["formats"],
                                                strict=True):
                if isinstance(json_cell, str):
                    assert md_cell == json_cell
                    continue
                if json_cell is None:
                    assert md_cell == "n/a"
                    continue
                shown = [float(x) for x in re.findall(r"[+-]?\d+(?:\.\d+)?", md_cell)]
                wanted = cell_numbers(json_cell)
                if isinstance(json_cell, dict) and len(shown) == 1:
                    wanted = wanted[:1]  # min and max equal at this precision
                assert len(shown) == len(wanted), (table_id, md_cell, json_cell)
                tolerance = 0.5 * 10 ** -decimals(spec) + 1e-9
                for s, w in zip(shown, wanted, strict=True):
                    assert abs(s - w) <= tolerance, (table_id, md_cell, json_cell)
                    checked += 1
    return checked


def test_report_runs_end_to_end_and_markdown_matches_json(tmp_path: Path) -> None:
    traces = write_traces(tmp_path / "traces")
    notes = write_notes(tmp_path / "notes")
    out = tmp_path / "docs"
    code = main(["report", "--tiny", "--out", str(out), "--trace", str(traces),
                 "--notes", str(notes)])
    assert code == 0
    text = (out / "results.md").read_text()
    for heading in SECTIONS:
        assert heading in text
    assert text.count("### Why (hand-written)") == len(results.STUDIES)
    assert "The tables above say what happened. (philly)" in text
    document = json.loads((out / "results" / "results.json").read_text())
    assert set(document["studies"]) == set(results.STUDIES)
    checked = assert_markdown_matches_json(text, document)
    assert checked > 100
    # The run's own numbers agree with a direct replay: SWAF's first-seed QoS at density 5.
    genie_runs = document["studies"]["genie"]["data"]["runs"]
    assert {r["policy"] for r in genie_runs} == {"swaf", "fifo", "tetris-cer", "sjf"}
    # SWAF as the study sets it up: every placement, a database profiled on the platform,
    # urgent tasks on the highest CER (Algorithm 1 line 13).
    workload = genie.generate(genie.GenieOptions(density=5.0, hours=2.0, seed=1))
    profiled = profile_platform(workload.nodes, TruthModel(TruthConfig(), 1),
                                {m: max(b) for m, b in BATCHES.items()})
    direct = summarise(simulate(
        workload, make_policy("swaf", modeldb=profiled.db, shape_mode="any",
                              urgent_placement="cer"),
        SimConfig(seed=1),
    ))
    logged = next(r for r in genie_runs
                  if (r["policy"], r["density"], r["seed"], r["variant"], r["shape_mode"],
                      r["interference"], r["noise"], r["modeldb"])
                  == ("swaf", 5.0, 1, "", "any", True, True, "profiled"))
    assert logged["summary"]["qos_pct"] == direct["qos_pct"]
    assert logged["summary"]["makespan_s"] == direct["makespan_s"]
    philly_data = document["studies"]["philly"]["data"]
    assert philly_data["workload_notes"]["1"]["jobs_in_vcs_without_size"] == 1
    assert philly_data["workload_notes"]["0.5"]["jobs_larger_than_vc"] == 1
    by = {(r["policy"], r["vc_scale"]): r for r in philly_data["runs"]}
    assert by[("fifo", 0.5)]["rejected"] == 2  # the unsized VC's job and the 16-GPU one
    assert by[("fifo", 1.0)]["rejected"] == 1
    assert by[("fifo", 0.5)]["finished"] == 32 - 2
    # One probe of the scale search (the tiny tolerance accepts any utilisation), then the
    # three policies at the found and the extra scales, and the unaligned FIFO and SJF.
    assert [p["vc_scale"] for p in philly_data["scale_search"]] == [0.75]
    assert philly_data["vc_scale"] == 0.75
    assert {r["policy"] for r in philly_data["runs"]} == {"fifo", "sjf", "qssf"}
    assert set(philly_data["unaligned"]) == {"fifo", "sjf"}
    assert "Regenerate: `trellis-sim run --workload philly --per-vc" in text
    tenants_runs = document["studies"]["tenants"]["data"]["runs"]
    assert set(tenants_runs) == {"none", "hard", "borrow", "fair"}
    # The unsized VC's job belongs to no account; the 16-GPU job of aaa111 (quota 16) runs.
    assert tenants_runs["none"]["accounts"]["ccc333"]["quota_gpus"] is None
    assert tenants_runs["hard"]["unfinished"] == 0
    assert tenants_runs["hard"]["preemptions"] == 0
    # Fair share ran through the master's own tracker: the same jobs, all finished.
    assert tenants_runs["fair"]["unfinished"] == tenants_runs["borrow"]["unfinished"] == 0
    openb_runs = document["studies"]["openb"]["data"]["runs"]
    assert set(openb_runs) == {"fifo", "drf", "soda_arrays", "soda_full", "no_allocator",
                               "no_placer", "no_eliminator", "no_arrays", "idle_lending",
                               "no_widening", "plain_fifo"}
    # SODA's mechanisms ran through the live code: the tuner tuned, cores went back.
    assert openb_runs["soda_full"]["tuned_parts"] > 0
    assert openb_runs["soda_full"]["cores_returned"] > 0
    assert openb_runs["soda_arrays"]["tuned_parts"] == 0
    # The second workload, from SODA's published distributions, ran the same variants, and
    # the paper's measure (busy share of GPUs in use) is reported beside the others.
    paper_runs = document["studies"]["openb"]["data"]["workloads"]["soda_paper"]["runs"]
    assert set(paper_runs) == set(openb_runs)
    assert paper_runs["soda_full"]["gpu_busy_of_active_pct"] is not None
    assert "soda_paper-main" in text and "busy of active" in text
    for name in document["studies"]["genie"]["figures"] + document["studies"]["openb"]["figures"]:
        path = out / "results" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size < 150_000
        assert f"](results/{name})" in text


def test_notes_with_numbers_not_in_the_tables_are_refused(tmp_path: Path) -> None:
    traces = write_traces(tmp_path / "traces")
    notes = write_notes(tmp_path / "notes")
    (notes / "openb.md").write_text("SODA wins by 987.6 points.\n")
    code = main(["report", "--tiny", "--studies", "openb", "--out", str(tmp_path / "o"),
                 "--trace", str(traces), "--notes", str(notes)])
    assert code == 2
    assert not (tmp_path / "o" / "results.md").exists()


def test_check_notes_accepts_numbers_the_text_states() -> None:
    check_notes("FIFO/SJF at 2.51 as in Table 3", "| 2.51 | Table 3 |", "n")
    with pytest.raises(ReportError, match=r"number\(s\) 2\.5 "):
        check_notes("ratio 2.5", "ratio 2.51", "n")


def test_registered_studies_are_complete(capsys: pytest.CaptureFixture) -> None:
    names = [study.name for study in REGISTRY]
    assert tuple(names) == results.STUDIES
    assert len(set(names)) == len(names)
    full = results.ReportConfig(out=Path("o"), trace_dir=Path("t")).studies
    tiny = results.tiny_config(Path("o"), Path("t")).studies
    for study in REGISTRY:
        assert isinstance(full[study.name], study.config)
        assert isinstance(tiny[study.name], study.config)
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert all(study.label in listed for study in REGISTRY)


def test_missing_notes_file_is_a_clear_error(tmp_path: Path) -> None:
    code = main(["report", "--tiny", "--studies", "genie", "--out", str(tmp_path / "o"),
                 "--trace", str(tmp_path), "--notes", str(tmp_path / "none")])
    assert code == 2


def test_unknown_study_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["report", "--studies", "genie,helios", "--out", str(tmp_path),
                 "--trace", str(tmp_path)])
    assert code == 2
    assert "--studies" in capsys.readouterr().err


def test_fmt_and_table_render_what_json_holds() -> None:
    table = Table("t", ["a", "b"], ["{}", "{:.1f}"])
    table.add("x", Spread.of([1.0, 2.0, 3.0]))
    table.add("y", None)
    assert table.markdown().splitlines()[-2:] == ["| x | 2.0 (1.0–3.0) |", "| y | n/a |"]
    assert table.to_json()["rows"][0][1] == {"mean": 2.0, "min": 1.0, "max": 3.0}
    assert fmt(Spread.of([5.0, 5.0])) == "5.0"
    with pytest.raises(ValueError, match="expected 2"):
        table.add("only one")


def test_per_vc_pins_jobs_to_their_vc_and_partitions_match_separate_replays(
    tmp_path: Path,
) -> None:
    traces = write_traces(tmp_path / "traces")
    truth = TruthModel(TruthConfig(noise_sigma=0.0), 1)
    workload = philly.load(traces, LoadOptions(), truth, per_vc=True)
    models = {n.gpu_model for n in workload.nodes}
    assert models == {"P40-vcaaa111", "P40-vcbbb222"}
    assert all(j.spec.gpu_model == f"P40-vc{j.spec.tenant}" for j in workload.jobs)
    assert workload.notes["jobs_in_vcs_without_size"] == 1
    parts = split_by_gpu_model(workload)
    assert sorted(p.label for p in parts) == ["", "P40-vcaaa111", "P40-vcbbb222"]
    config = SimConfig(seed=1, truth=TruthConfig(noise_sigma=0.0), sample_interval=300.0)
    merged = simulate_partitioned(workload, lambda: make_policy("fifo"), config)
    by_id = {r.id: r for r in merged.records}
    for part in parts:
        alone = simulate(part.workload, make_policy("fifo"), config)
        for record in alone.records:
            assert by_id[record.id].end == record.end
            assert by_id[record.id].state == record.state
    unsized = [r for r in merged.records if r.tenant == "ccc333"]
    assert [r.state for r in unsized] == ["rejected"]
    assert merged.total_gpus == 24
    summary = summarise(merged)
    assert summary["finished"] == summary["jobs"] - 1
    # The merged usage never holds more GPUs than the cluster has.
    assert max(a for _, a, _ in merged.usage) <= 24


def test_single_core_per_vc_lets_a_fifo_head_block_other_vcs(tmp_path: Path) -> None:
    """Why --per-vc replays one core per VC: with one core, a waiting head blocks all VCs."""
    traces = tmp_path / "t"
    traces.mkdir()
    (traces / "philly-vcs.csv").write_text("vc,node num\naaa111,1\nbbb222,1\n")
    (traces / "philly-jobs.csv").write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-02 00:00:00,3600.0,8,28800.0,aaa111\n"
        "2017-10-02 00:01:00,600.0,8,4800.0,aaa111\n"
        "2017-10-02 00:02:00,600.0,1,600.0,bbb222\n"
    )
    truth = TruthModel(TruthConfig(noise_sigma=0.0), 1)
    workload = philly.load(traces, LoadOptions(), truth, per_vc=True)
    config = SimConfig(truth=TruthConfig(noise_sigma=0.0), sample_interval=300.0)
    one_core = {r.id: r for r in simulate(workload, make_policy("fifo"), config).records}
    per_vc = {r.id: r for r in simulate_partitioned(
        workload, lambda: make_policy("fifo"), config).records}
    small = next(k for k, r in per_vc.items() if r.tenant == "bbb222")
    assert per_vc[small].queue_delay == pytest.approx(0.0)
    assert one_core[small].queue_delay == pytest.approx(3600.0 - 120.0)


def test_vc_scale_and_window_options(tmp_path: Path) -> None:
    traces = write_traces(tmp_path / "traces")
    truth = TruthModel(TruthConfig(), 1)
    since = philly._parse_timestamp("2017-10-01 00:00:00", "t")
    half = philly.load(traces, LoadOptions(), truth, per_vc=True, vc_scale=0.5, since=since)
    assert half.notes["nodes"] == 2  # round(2 × 0.5) = 1 and max(1, round(0.5)) = 1
    assert half.notes["jobs_larger_than_vc"] == 1
    assert half.notes["jobs_in_window"] == 32
    with pytest.raises(ValueError, match="per-VC"):
        philly.load(traces, LoadOptions(), truth, vc_scale=0.5)
    with pytest.raises(ValueError, match="cannot be combined"):
        philly.load(traces, LoadOptions(), truth, per_vc=True, nodes_override=3)
    with pytest.raises(ValueError, match="empty"):
        philly.load(traces, LoadOptions(), truth, since=since, until=since)


def test_openb_scale_stride_and_since(tmp_path: Path) -> None:
    traces = write_traces(tmp_path / "traces")
    truth = TruthModel(TruthConfig(), 1)
    plain = openb.load(traces, LoadOptions(), truth)
    fast = openb.load(traces, LoadOptions(), truth, arrival_scale=4.0, node_stride=2,
                      since=600.0)
    assert len(fast.nodes) == 2 and fast.notes["nodes_listed"] == 3
    assert len(fast.jobs) == len([j for j in plain.jobs if j.submit >= 600.0])
    assert fast.jobs[-1].submit == pytest.approx((plain.jobs[-1].submit - 600.0) / 4.0)
    with pytest.raises(ValueError, match="positive"):
        openb.load(traces, LoadOptions(), truth, arrival_scale=0.0)


def test_cli_run_per_vc_and_flag_checks(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    traces = write_traces(tmp_path / "traces")
    out = tmp_path / "run"
    code = main(["run", "--workload", "philly", "--trace", str(traces), "--per-vc",
                 "--policies", "fifo,sjf", "--out", str(out), "--no-progress", "--no-plots"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert all(r["rejected"] == 1 for r in summary["runs"])
    assert main(["run", "--workload", "genie", "--per-vc", "--out", str(out)]) == 2
    assert "philly only" in capsys.readouterr().err
    assert main(["run", "--workload", "philly", "--trace", str(traces), "--since",
                 "yesterday", "--out", str(out)]) == 2
    assert "--since" in capsys.readouterr().err


def test_oracle_predicts_recorded_durations(tmp_path: Path) -> None:
    traces = write_traces(tmp_path / "traces")
    config = TruthConfig(noise_sigma=0.0)
    workload = philly.load(traces, LoadOptions(), TruthModel(config, 1))
    db = oracle_modeldb(config, "P40")
    errors = prediction_errors(db, workload.jobs, NodeTopology.of(workload.nodes))
    assert errors["jobs"] == len(workload.jobs)
    # Packed jobs of up to one PCIe switch predict their duration up to iteration rounding;
    # larger ones miss only the truth's locality term, a few per cent at most.
    assert errors["mean_pct"] < 5.0
    assert errors["max_pct"] < 12.0


def test_committed_results_match_their_json_and_notes() -> None:
    """docs/results.md was regenerated after the last edit of its notes, from its own JSON."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "results.md").read_text()
    document = json.loads((docs / "results" / "results.json").read_text())
    assert assert_markdown_matches_json(text, document) > 500
    for study in results.STUDIES:
        assert (results.NOTES_DIR / f"{study}.md").read_text().strip() in text
    for heading in SECTIONS:
        assert heading in text
