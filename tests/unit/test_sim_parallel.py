"""Replays on Dask give the serial numbers bit for bit; the runner's errors are clear."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from masterd.core.policies.fifo import FifoPolicy
from sim.cli import main
from sim.engine import SimConfig
from sim.parallel import DaskRunner, RunnerError, SerialRunner, open_runner
from sim.studies import genie as genie_study
from sim.studies.common import ReplayCall, replay_all
from sim.workloads import genie


def _square(x: int) -> int:
    return x * x


def test_serial_runner_maps_in_order() -> None:
    with SerialRunner() as runner:
        assert runner.map(_square, [3, 1, 2]) == [9, 1, 4]


def test_genie_study_on_dask_equals_serial_bit_for_bit(tmp_path: Path) -> None:
    study = replace(genie_study.tiny(), seeds=(1, 2, 3))
    for name in ("s", "d"):
        (tmp_path / name).mkdir()
    serial = genie_study.run_on(study, Path("."), tmp_path / "s", False, SerialRunner())
    with DaskRunner(workers=2) as runner:
        parallel = genie_study.run_on(study, Path("."), tmp_path / "d", False, runner)
    assert json.dumps(parallel.data, sort_keys=True, default=str) == json.dumps(
        serial.data, sort_keys=True, default=str)
    # Every table too (the setup sentence names the runner, so the text differs there only).
    assert [t.to_json() for t in parallel.tables()] == [t.to_json() for t in serial.tables()]


def test_replay_all_hands_calls_to_the_runner() -> None:
    workload = genie.generate(genie.GenieOptions(density=5.0, hours=1.0, seed=3))
    calls = [ReplayCall(f"c{i}", workload, FifoPolicy, SimConfig(seed=i)) for i in (1, 2)]
    serial = replay_all(calls, show=False)
    with DaskRunner(workers=1) as runner:
        remote = replay_all(calls, show=False, runner=runner)
    for (a, _), (b, _) in zip(serial, remote, strict=True):
        assert [asdict(r) for r in a.records] == [asdict(r) for r in b.records]
        assert a.usage == b.usage


def test_unreachable_scheduler_is_a_clear_error() -> None:
    runner = DaskRunner(scheduler="tcp://127.0.0.1:9", connect_timeout_s=2.0)
    with pytest.raises(RunnerError, match=r"cannot start or reach Dask at tcp://127\.0\.0\.1:9"):
        runner.__enter__()


def test_runner_options_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(RunnerError, match="--serial"):
        open_runner(scheduler="tcp://x:1", serial=True)
    with pytest.raises(RunnerError, match="at least 1"):
        DaskRunner(workers=0)
    for argv in (["--serial", "--scheduler", "tcp://x:1"], ["--workers", "0"],
                 ["--scheduler", "tcp://x:1", "--workers", "2"]):
        code = main(["report", "--tiny", "--studies", "genie", "--out", str(tmp_path),
                     "--trace", str(tmp_path), *argv])
        assert code == 2
        err = capsys.readouterr().err
        assert err.startswith("trellis-sim: error:") and "Traceback" not in err
    with pytest.raises(RunnerError, match="not started"):
        DaskRunner(workers=1).map(_square, [1])
