"""What every study of ``trellis-sim report`` shares.

:class:`Study` (what a study module registers), :class:`Section` (the part of ``results.md`` a
study generates), :class:`ReportError`, the notes check (hand-written notes may only repeat
numbers the generated text states), the replay helper, queueing statistics, plot helpers and
the policies' display names.
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from masterd.core.policies import REGISTRY
from masterd.core.policy import Policy
from sim.engine import SimConfig, SimResult, simulate
from sim.metrics import mean, percentile
from sim.parallel import Runner, SerialRunner
from sim.partition import simulate_partitioned
from sim.progress import ProgressBar
from sim.tables import Table
from sim.workloads.base import Workload

log = logging.getLogger("trellis.sim.results")

POLICY_TITLES = {
    "swaf": "SWAF (GENIE)",
    "fifo": "FIFO",
    "capacity": "Capacity",
    "min-min": "Min-Min",
    "weighted-fair": "Weighted Fair",
    "tetris-perf": "Tetris+Perf",
    "tetris-cer": "Tetris+CER",
    "sjf": "SJF",
    "qssf": "QSSF",
    "drf": "DRF",
    "soda-arrays": "SODA arrays",
}
# GENIE-family policies: they accept a model database (used for SJF's perfect knowledge).
PREDICTING = frozenset({"swaf", "sjf", "min-min", "weighted-fair", "tetris-perf", "tetris-cer",
                        "capacity"})
QUEUED_THRESHOLD_S = 1.0  # a job "queued" if it waited at least this long (Helios' count)


class ReportError(ValueError):
    """The report cannot be produced as configured (bad option, notes stating numbers...)."""


def title(policy: str) -> str:
    return POLICY_TITLES.get(policy, policy)


# -- the study interface ---------------------------------------------------------------------

C = TypeVar("C")


def no_options(parser: argparse.ArgumentParser) -> None:
    """A study without options of its own on ``trellis-sim report``."""


def keep_config(config: C, args: argparse.Namespace) -> C:
    return config


@dataclass(frozen=True)
class Study(Generic[C]):
    """One study of the report, as its module registers it in ``sim.studies.REGISTRY``.

    ``name`` selects it (``--studies``), names its notes (``<notes>/<name>.md``) and its entry
    in ``results.json``; ``label`` is how ``trellis-sim report --help`` lists it. ``config`` is
    its configuration dataclass: ``config()`` is the full study, ``tiny()`` one that runs in
    seconds (``--tiny``). ``run(config, trace_dir, out_dir, show)`` replays it, writes its
    plots into ``out_dir`` (``show``: draw progress bars) and returns its :class:`Section`,
    whose heading the report numbers by the study's place in the registry.
    ``add_options(parser)`` adds its own options to ``trellis-sim report`` and
    ``apply_options(config, args)`` returns the configuration those options give (raising
    :class:`ReportError` for bad values).

    ``run_on(config, trace_dir, out_dir, show, runner)``, when a study has it, is ``run``
    with its replays handed to a :class:`~sim.parallel.Runner` (on Dask unless the report
    runs ``--serial``). A study adopts it by collecting its replays as :class:`ReplayCall`
    objects, running them with :func:`replay_all` (or ``runner.map`` over its own task
    function) and registering ``run_on=...``; ``run`` stays the serial path.
    """

    name: str
    label: str
    config: type[C]
    run: Callable[[C, Path, Path, bool], Section]
    tiny: Callable[[], C]
    add_options: Callable[[argparse.ArgumentParser], None] = no_options
    apply_options: Callable[[C, argparse.Namespace], C] = keep_config
    run_on: Callable[[C, Path, Path, bool, Runner], Section] | None = None


def check_policies(names: Sequence[str], where: str) -> None:
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ReportError(f"{where}: unknown policies {', '.join(unknown)}; "
                          f"registered: {', '.join(sorted(REGISTRY))}")


def csv_list(text: str, convert: type, what: str) -> list[Any]:
    """A comma-separated option value (``what`` names the option in errors)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ReportError(f"{what}: give at least one value")
    try:
        return [convert(t) for t in items]
    except ValueError:
        raise ReportError(f"{what}: {text!r} is not a comma-separated list of numbers") from None


# -- running replays -------------------------------------------------------------------------


@dataclass
class Replay:
    """One replay: its result, its summary and the wall time it took."""

    key: dict[str, Any]
    result: SimResult
    summary: dict[str, Any]
    wall_s: float


def replay(
    label: str,
    workload: Workload,
    factory: Callable[[], Policy],
    config: SimConfig,
    show: bool,
    partitioned: bool = False,
) -> tuple[SimResult, float]:
    """Replay ``workload`` (one core per partition if ``partitioned``); result and wall time."""
    bar = ProgressBar(label) if show else None
    started = time.monotonic()
    if partitioned:
        result = simulate_partitioned(workload, factory, config, bar)
    else:
        result = simulate(workload, factory(), config, bar)
    if bar is not None:
        done = sum(r.state != "unfinished" for r in result.records)
        bar.close(result.end_time, done, len(result.records))
    return result, time.monotonic() - started


@dataclass(frozen=True)
class ReplayCall:
    """One replay for :func:`replay_all`: what :func:`replay` takes, minus ``show``."""

    label: str
    workload: Workload
    factory: Callable[[], Policy]
    config: SimConfig
    partitioned: bool = False


def _replay_call(call: ReplayCall) -> tuple[SimResult, float]:
    return replay(call.label, call.workload, call.factory, call.config, False,
                  call.partitioned)


def replay_all(
    calls: Sequence[ReplayCall], show: bool, runner: Runner | None = None
) -> list[tuple[SimResult, float]]:
    """Every replay of ``calls`` (result and wall time each, in order), on ``runner``.

    Serially (no runner, or a :class:`~sim.parallel.SerialRunner`) each replay draws its own
    progress bar; on Dask the runner counts finished replays instead. Each call's workload
    and factory travel to the workers by pickle.
    """
    if runner is None or isinstance(runner, SerialRunner):
        return [replay(c.label, c.workload, c.factory, c.config, show, c.partitioned)
                for c in calls]
    return runner.map(_replay_call, list(calls), "replays")


def finished(result: SimResult, gpu: bool | None = None) -> list:
    """Finished jobs' records; only GPU (``gpu=True``) or CPU (``False``) jobs if given."""
    return [
        r for r in result.records
        if r.state == "finished" and (gpu is None or (r.gpus > 0) == gpu)
    ]


def queue_stats(records: Sequence, threshold: float = QUEUED_THRESHOLD_S) -> dict[str, Any]:
    delays = [r.queue_delay for r in records if r.queue_delay is not None]
    n = len(delays)
    return {
        "jobs": n,
        "avg_s": mean(delays),
        "p99_s": percentile(delays, 99),
        "queued": sum(d >= threshold for d in delays),
        "over_1min_pct": 100.0 * sum(d > 60 for d in delays) / n if n else None,
        "not_queued_pct": 100.0 * sum(d < threshold for d in delays) / n if n else None,
        "within_10s_pct": 100.0 * sum(d <= 10 for d in delays) / n if n else None,
        "within_1min_pct": 100.0 * sum(d <= 60 for d in delays) / n if n else None,
    }


# -- the document ----------------------------------------------------------------------------


@dataclass
class Section:
    study: str
    heading: str
    parts: list[str | Table] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    data: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def text(self, line: str) -> None:
        self.parts.append(line)

    def table(self, table: Table) -> Table:
        self.parts.append(table)
        return table

    def generated_markdown(self) -> str:
        out = []
        for part in self.parts:
            out.append(part.markdown() if isinstance(part, Table) else part)
        for name, caption in self.figures:
            out.append(f"![{caption}](results/{name})\n*{caption}*")
        return "\n\n".join(out)

    def tables(self) -> list[Table]:
        return [p for p in self.parts if isinstance(p, Table)]


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def numbers_in(text: str) -> set[str]:
    return set(_NUMBER.findall(text))


def check_notes(notes: str, generated: str, where: str) -> None:
    """Hand-written notes may only repeat numbers the generated text states."""
    stray = sorted(numbers_in(notes) - numbers_in(generated))
    if stray:
        raise ReportError(
            f"{where} states number(s) {', '.join(stray)} that the generated tables do not; "
            "refer to the tables instead"
        )


def read_notes(notes_dir: Path, study: str) -> str:
    path = notes_dir / f"{study}.md"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ReportError(f"cannot read the explanation of study {study}: {path}: "
                          f"{exc.strerror}") from None


# -- plots -----------------------------------------------------------------------------------


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or None (logged) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("plots_skipped reason=matplotlib_not_installed")
        return None
    return plt


def save_figure(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def plot_cdf(ax: Any, values: Sequence[float], label: str, log_x: bool = False) -> None:
    xs = sorted(values)
    if not xs:
        return
    if log_x:
        xs = [max(x, 1.0) for x in xs]
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    step = max(1, len(xs) // 400)  # a few hundred points draw the same curve, smaller PNG
    ax.plot([*xs[::step], xs[-1]], [*ys[::step], 1.0], label=label, linewidth=1.2)
