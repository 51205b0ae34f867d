"""Maintenance windows and drains in a replay (sim/calendar.py): the core keeps jobs whose
time limit crosses a window off its node, nothing starts inside it, nobody runs there when it
begins; a drain closes a node and leaves its running job; watched GPUs are integrated
exactly; a window or drain naming an unknown node is one sentence."""

from __future__ import annotations

import dataclasses
import re

import pytest

from masterd.core.policies import make_policy
from shared.maintenance import Window
from shared.model import JobSpec
from sim.calendar import Drain, gpu_seconds
from sim.cluster import NodeGroup, build_cluster
from sim.engine import SimConfig, SimulationError, simulate
from sim.truth import TruthConfig, TruthParams
from sim.workloads.base import SimJob, Workload

EXACT = SimConfig(seed=1, truth=TruthConfig(noise_sigma=0.0, interference=False))


def two_nodes() -> list:
    return build_cluster([NodeGroup(count=2, gpus_per_node=1, cpu_cores=2, sockets=1,
                                    gpus_per_switch=1, prefix="n")])


def limited(name: str, submit: float, duration: float, limit: float) -> SimJob:
    spec = JobSpec(name=name, command=("x",), user="u", gpus=1, cpus=1, time_limit_s=limit)
    return SimJob(name, spec, submit, TruthParams(known_duration=duration, known_gpus=1))


def test_a_window_keeps_crossing_jobs_off_its_node_and_nothing_runs_into_it() -> None:
    nodes = two_nodes()
    a, _ = sorted(n.name for n in nodes)
    # The window on a begins at 10,000 s. "long" (limit 20,000) may not start on a; "short"
    # (limit 3,600) may; "other" (limit 30,000) may not before the window; "late" arrives
    # inside it, behind "other" in FIFO order.
    jobs = [limited("long", 0.0, 15_000.0, 20_000.0), limited("short", 1.0, 3_000.0, 3_600.0),
            limited("other", 2.0, 20_000.0, 30_000.0), limited("late", 10_500.0, 100.0, 600.0)]
    window = Window("w", a, 10_000.0, 14_000.0)
    config = dataclasses.replace(EXACT, windows=(window,), watch_nodes=(a,))
    result = simulate(Workload("w", jobs, nodes), make_policy("fifo"), config)
    by_id = {r.id: r for r in result.records}
    assert all(r.state == "finished" for r in result.records), by_id
    assert result.running_at_window_start == {"w": 0}
    # long took b at 0; short ran on a from 1 to 3,001; a then stayed idle: other would
    # have crossed the window. Other starts on a when the window ends, late on b when long
    # ends.
    assert by_id["long"].first_start == 0.0 and by_id["short"].first_start == 1.0
    assert by_id["other"].first_start == 14_000.0
    assert by_id["late"].first_start == 15_000.0
    # a held one GPU for short (3,000 s) before the window, none inside it.
    assert gpu_seconds(result.watched_usage, 0.0, 10_000.0) == 3_000.0
    assert gpu_seconds(result.watched_usage, 10_000.0, 14_000.0) == 0.0


def test_a_drain_closes_a_node_and_leaves_its_running_job() -> None:
    nodes = two_nodes()
    a, b = sorted(n.name for n in nodes)
    jobs = [limited("first", 0.0, 500.0, 1_000.0), limited("second", 0.0, 500.0, 1_000.0),
            limited("third", 100.0, 50.0, 100.0)]
    config = dataclasses.replace(EXACT, drains=(Drain((a, b), 50.0, 600.0),))
    result = simulate(Workload("d", jobs, nodes), make_policy("fifo"), config)
    by_id = {r.id: r for r in result.records}
    assert by_id["first"].end == 500.0 and by_id["second"].end == 500.0  # left running
    assert by_id["third"].first_start == 600.0  # nothing new while drained


def test_a_calendar_naming_unknown_nodes_is_refused() -> None:
    workload = Workload("x", [limited("j", 0.0, 1.0, 10.0)], two_nodes())
    for config, why in (
        (dataclasses.replace(EXACT, windows=(Window("w", "zz-1", 10.0, 20.0),)),
         "window w names unknown node(s) zz-1"),
        (dataclasses.replace(EXACT, drains=(Drain(("zz-2",), 10.0, 20.0),)),
         "names unknown node(s) zz-2"),
        (dataclasses.replace(EXACT, watch_nodes=("zz-3",)), "watched node(s) unknown: zz-3"),
    ):
        with pytest.raises(SimulationError, match=re.escape(why)):
            simulate(workload, make_policy("fifo"), config)


def test_gpu_seconds_integrates_a_step_series() -> None:
    series = [(0.0, 0), (10.0, 2), (20.0, 1)]
    assert gpu_seconds(series, 0.0, 30.0) == 2 * 10 + 1 * 10
    assert gpu_seconds(series, 15.0, 25.0) == 2 * 5 + 1 * 5
