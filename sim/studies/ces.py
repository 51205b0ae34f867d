"""Study: Cluster Energy Saving on Philly's node activity (Helios §4.3, Table 5).

``philly-node-sequence.csv`` (the Helios artifact's CES input: busy and total GPU nodes per
minute, 2017-10-03 to 2017-12-15) becomes 10-minute maxima, as the artifact does. The
forecaster is :mod:`masterd.core.helios.forecast` and the decisions are
:mod:`masterd.core.helios.ces` — the modules the master's power manager runs — stepped every
10 minutes over 1–14 December, after training on the steps before November and stopping
early on November (the artifact's split).

Three policies share the replay: CES with our strictly causal forecast (every feature of a
forecast made at step ``o`` uses values up to ``o``); CES with the artifact's own features,
which it computes on the very series it predicts (rolling statistics one hour old and a 3-h
lag while forecasting 3–5 h ahead: values a live forecaster cannot have), to measure what that
leak is worth; and the power-down-when-idle baseline (always ``busy + σ`` powered).

Energy: an idle DGX-1 draws about 800 W and cooling takes twice the servers' energy (Helios
§4.3.3: with the Table 5 node counts that gives their 1.65 million kWh a year), so a node
powered down saves 3 × 800 W.

The forecaster is also fitted on ``helios-venus-throughput.csv`` (Venus, 2020): that file has
submitted, started and ended jobs and GPUs per 10 minutes but no occupancy, so the series
forecast is the GPUs in use, the running sum of started minus ended GPUs shifted so that its
lowest point is zero (jobs already running on 1 April are not in the file) — an assumption,
stated in the table.
"""

from __future__ import annotations

import argparse
import csv
import time
import warnings
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from masterd.core.helios import ces, forecast
from sim.studies.common import ReportError, Section, Study, pyplot, save_figure
from sim.tables import Table, fmt
from sim.workloads.base import TraceError

NODE_FILE = "philly-node-sequence.csv"
VENUS_FILE = "helios-venus-throughput.csv"
IDLE_NODE_W = 800.0  # Helios §4.3.3: one idle DGX-1
COOLING_FACTOR = 2.0  # cooling consumes twice the servers' energy
HOURS_PER_YEAR = 24 * 365

HELIOS_TABLE5 = {
    "source": "Helios §4.3.3, Table 5 (Philly column) and text (seeds/helios.md)",
    "nodes_powered_down_avg": 100.1,
    "wakeups_per_day": 0.5,
    "nodes_per_wakeup": 27.1,
    "util_without_pct": 69.0,
    "util_with_pct": 90.4,
    "vanilla_wakeups_per_day": 34.1,  # Helios clusters, a vanilla power-down policy
}


@dataclass(frozen=True)
class CesStudy:
    train_end: str = "2017-11-01"  # train on targets before November ...
    valid_end: str = "2017-12-01"  # ... stop early on November ...
    test_start: str = "2017-12-01"  # ... replay 1-14 December
    test_end: str = "2017-12-15"
    buffer: int = 20  # the artifact's Philly settings (CES_Philly.py)
    history_steps: int = 2
    future_steps: int = 30
    history_threshold: float = 0.1
    future_threshold: float = 0.0
    min_decrease: int = 1
    cooldown_steps: int = 10
    max_rounds: int = forecast.MAX_ROUNDS
    venus: bool = True
    venus_train_end: str = "2020-08-01"
    venus_valid_end: str = "2020-09-01"
    venus_test_end: str = "2020-09-22"  # Helios evaluated 1-21 September
    venus_future_steps: int = 18  # Helios clusters: 3 h ahead

    @property
    def params(self) -> ces.CesParams:
        return ces.CesParams(buffer=self.buffer, history_steps=self.history_steps,
                             future_steps=self.future_steps,
                             history_threshold=self.history_threshold,
                             future_threshold=self.future_threshold,
                             min_decrease=self.min_decrease, cooldown_steps=self.cooldown_steps)


def tiny() -> CesStudy:
    """Five days (the tests' tiny trace): train two, validate one, replay the last two."""
    return replace(CesStudy(), train_end="2017-10-03", valid_end="2017-10-04",
                   test_start="2017-10-04", test_end="2017-10-06", buffer=2, max_rounds=20,
                   venus=False)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ces-buffer", type=int, help="CES buffer σ of idle powered nodes "
                        "(default 20, the artifact's Philly setting)")
    parser.add_argument("--no-ces-venus", action="store_true",
                        help="skip the forecaster on helios-venus-throughput.csv")


def apply_options(study: CesStudy, args: argparse.Namespace) -> CesStudy:
    buffer = getattr(args, "ces_buffer", None)
    if buffer is not None:
        if buffer < 0:
            raise ReportError(f"--ces-buffer must not be negative, got {buffer}")
        study = replace(study, buffer=buffer)
    if getattr(args, "no_ces_venus", False):
        study = replace(study, venus=False)
    return study


def _stamp(text: str) -> float:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(f"ces: {text!r} is not a date (YYYY-MM-DD)") from None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


@dataclass
class Series:
    """One value per 10-minute step (the maximum within it), gaps carried forward."""

    times: np.ndarray  # start of each step, epoch seconds
    values: np.ndarray
    total: np.ndarray  # nodes in the cluster at each step (max)
    gaps: int  # steps without a sample, filled with the previous step's value

    def index(self, when: float) -> int:
        return int((when - self.times[0]) // forecast.STEP_S)


def load_node_sequence(path: Path) -> Series:
    """philly-node-sequence.csv: time, active (busy nodes), total."""
    stamps: list[float] = []
    busy: list[float] = []
    total: list[float] = []
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = {"time", "active", "total"} - set(reader.fieldnames or ())
            if missing:
                raise TraceError(path, 1, f"missing column(s) {', '.join(sorted(missing))}")
            for line, row in enumerate(reader, start=2):
                try:
                    stamp = datetime.fromisoformat(row["time"].strip())
                    a, t = float(row["active"]), float(row["total"])
                except (ValueError, AttributeError):
                    raise TraceError(path, line, "expected time (YYYY-MM-DD HH:MM:SS), "
                                     "active and total (numbers)") from None
                if not (0 <= a <= t):
                    raise TraceError(path, line, f"active {a:g} must be within 0..total {t:g}")
                stamps.append((stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC))
                              .timestamp())
                busy.append(a)
                total.append(t)
    except OSError as exc:
        raise TraceError(path, None, f"cannot read: {exc.strerror}") from None
    if not stamps:
        raise TraceError(path, None, "no rows")
    return _bucket(np.array(stamps), np.array(busy), np.array(total))


def load_venus(path: Path) -> Series:
    """helios-venus-throughput.csv: GPUs in use, from started minus ended GPUs per step."""
    stamps: list[float] = []
    change: list[float] = []
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = {"time", "start_gpu_num", "end_gpu_num"} - set(reader.fieldnames or ())
            if missing:
                raise TraceError(path, 1, f"missing column(s) {', '.join(sorted(missing))}")
            for line, row in enumerate(reader, start=2):
                try:
                    stamp = datetime.fromisoformat(row["time"].strip())
                    delta = float(row["start_gpu_num"]) - float(row["end_gpu_num"])
                except (ValueError, AttributeError):
                    raise TraceError(path, line, "expected time, start_gpu_num and "
                                     "end_gpu_num") from None
                stamps.append((stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC))
                              .timestamp())
                change.append(delta)
    except OSError as exc:
        raise TraceError(path, None, f"cannot read: {exc.strerror}") from None
    if not stamps:
        raise TraceError(path, None, "no rows")
    in_use = np.cumsum(change)
    in_use -= in_use.min()
    return _bucket(np.array(stamps), in_use, np.full(len(in_use), in_use.max()))


def _bucket(stamps: np.ndarray, values: np.ndarray, total: np.ndarray) -> Series:
    order = np.argsort(stamps, kind="stable")
    stamps, values, total = stamps[order], values[order], total[order]
    start = stamps[0] - stamps[0] % forecast.STEP_S
    steps = ((stamps - start) // forecast.STEP_S).astype(int)
    n = int(steps[-1]) + 1
    out = np.full(n, np.nan)
    tot = np.full(n, np.nan)
    np.fmax.at(out, steps, values)
    np.fmax.at(tot, steps, total)
    gaps = int(np.isnan(out).sum())
    for arr in (out, tot):
        for i in range(1, n):
            if np.isnan(arr[i]):
                arr[i] = arr[i - 1]
    return Series(start + np.arange(n) * forecast.STEP_S, out, tot, gaps)


def artifact_features(y: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The Helios artifact's CES features for every step, computed on the series itself:
    calendar, rolling mean/median/std over 3 and 6 steps of values one hour (6 steps) old,
    the value 3 h (18 steps) before and a soft average around it. Used only to measure the
    leak; the master never computes these."""
    n = len(y)

    def shifted(k: int) -> np.ndarray:
        out = np.full(n, np.nan)
        out[k:] = y[:n - k]
        return out

    cols = [forecast.calendar(times)]
    for width in (3, 6):
        windows = np.full((n, width), np.nan)
        base = shifted(6)
        for j in range(width):
            windows[width - 1:, j] = base[j:n - width + 1 + j]
        # The first steps have no hour-old window yet: NaN features, which LightGBM accepts.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            cols += [np.nanmean(windows, axis=1)[:, None],
                     np.nanmedian(windows, axis=1)[:, None],
                     np.nanstd(windows, axis=1, ddof=1)[:, None]]
    lag = shifted(forecast.LAG_3H)
    soft = 0.5 * lag + 0.25 * (shifted(forecast.LAG_3H + 1) + shifted(forecast.LAG_3H - 1))
    cols += [lag[:, None], soft[:, None]]
    return np.hstack(cols)


def fit_artifact(series: Series, train_end: int, valid_end: int, max_rounds: int) -> np.ndarray:
    """Train on the artifact's features, predict every step (the leaky series)."""
    import lightgbm as lgb

    x = artifact_features(series.values, series.times)
    y = series.values
    first = forecast.DAY_STEPS
    train = lgb.Dataset(x[first:train_end], y[first:train_end])
    valid = lgb.Dataset(x[train_end:valid_end], y[train_end:valid_end], reference=train)
    booster = lgb.train(forecast.LGB_PARAMS, train, num_boost_round=max_rounds,
                        valid_sets=[valid],
                        callbacks=[lgb.early_stopping(forecast.EARLY_STOP, verbose=False)])
    return np.maximum(booster.predict(x, num_threads=1), 0.0)


@dataclass
class CesRun:
    powered: np.ndarray
    woken: np.ndarray
    shed: np.ndarray


def replay(series: Series, params: ces.CesParams, first: int, last: int,
           forecasts: np.ndarray | None, vanilla: bool = False) -> CesRun:
    """Step the decisions over steps [first, last): ``forecasts[k]`` is the forecast (2F
    steps, starting at step first + k) available at that step; None replays the baseline."""
    busy = np.floor(series.values).astype(int)
    total = np.floor(series.total).astype(int)
    state = ces.CesState(powered=min(int(total[first]), int(busy[first]) + params.buffer))
    powered, woken, shed = [], [], []
    for k, i in enumerate(range(first, last)):
        if vanilla:
            result = ces.vanilla_step(params, state, int(busy[i]), int(total[i]))
        else:
            fc = None if forecasts is None else np.floor(forecasts[k])
            result = ces.step(params, state, i, busy[max(0, i - params.history_steps):i],
                              int(busy[i]), fc, int(total[i]))
        powered.append(result.powered)
        woken.append(result.woken)
        shed.append(result.shed)
    return CesRun(np.array(powered), np.array(woken), np.array(shed))


def table5(series: Series, run: CesRun, first: int, last: int) -> dict[str, float | None]:
    busy = np.floor(series.values[first:last])
    total = np.floor(series.total[first:last])
    days = (last - first) * forecast.STEP_S / 86400.0
    wakes = run.woken[run.woken > 0]
    down = total - run.powered
    return {
        "nodes_powered_down_avg": float(down.mean()),
        "wakeups_per_day": float(len(wakes) / days),
        "nodes_per_wakeup": float(wakes.mean()) if len(wakes) else None,
        "util_without_pct": float(100 * (busy / total).mean()),
        "util_with_pct": float(100 * (busy / np.maximum(run.powered, 1)).mean()),
        "energy_saved_mwh_per_year": energy_mwh(float(down.mean())),
        "steps_short_of_nodes": int((busy > run.powered).sum()),
    }


def energy_mwh(nodes_down: float) -> float:
    """MWh a year saved by ``nodes_down`` nodes powered down on average."""
    return nodes_down * IDLE_NODE_W * (1 + COOLING_FACTOR) * HOURS_PER_YEAR / 1e6


def causal_forecasts(series: Series, train_end: int, valid_end: int, first: int, last: int,
                     horizon: int, max_rounds: int) -> tuple[np.ndarray, forecast.Fit]:
    """Forecasts made at origins first-1 .. last-2 (each for the next ``horizon`` steps)."""
    fit = forecast.fit(series.values, series.times, train_end, valid_end, horizon, max_rounds)
    model = forecast.Forecaster(fit.model, horizon)
    origins = np.arange(first - 1, last - 1)
    # Forecasts past the series' end have no truth to compare with but are still made.
    return model.predict(series.values, series.times, origins), fit


def smape_at(series: Series, forecasts: np.ndarray, first: int, last: int, h_low: int,
             h_high: int) -> float:
    """SMAPE of the causal forecasts at horizons h_low..h_high steps (1 = the next step)."""
    predicted, actual = [], []
    n = len(series.values)
    for k, origin in enumerate(range(first - 1, last - 1)):
        for h in range(h_low, h_high + 1):
            if origin + h < min(n, last):
                predicted.append(forecasts[k][h - 1])
                actual.append(series.values[origin + h])
    return forecast.smape(predicted, actual)


def run(study: CesStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    started = time.monotonic()
    section = Section("ces", "Cluster Energy Saving on Philly (Helios §4.3, Table 5)")
    series = load_node_sequence(trace_dir / NODE_FILE)
    params = study.params
    train_end, valid_end = series.index(_stamp(study.train_end)), series.index(
        _stamp(study.valid_end))
    first, last = series.index(_stamp(study.test_start)), series.index(_stamp(study.test_end))
    last = min(last, len(series.values))
    if not (forecast.LOOKBACK < train_end < valid_end <= first < last):
        raise ReportError("ces: the node sequence does not cover training, validation and "
                          f"test ({study.train_end}, {study.valid_end}, {study.test_start} to "
                          f"{study.test_end})")
    horizon = 2 * params.future_steps
    fit_started = time.monotonic()
    causal, fit = causal_forecasts(series, train_end, valid_end, first, last, horizon,
                                   study.max_rounds)
    fit_s = time.monotonic() - fit_started
    leaky_series = fit_artifact(series, train_end, valid_end, study.max_rounds)
    leaky = np.array([leaky_series[i:i + horizon] if i + horizon <= len(leaky_series)
                      else np.pad(leaky_series[i:], (0, i + horizon - len(leaky_series)),
                                  mode="edge") for i in range(first, last)])
    runs = {
        "causal": replay(series, params, first, last, causal),
        "artifact": replay(series, params, first, last, leaky),
        "vanilla": replay(series, params, first, last, None, vanilla=True),
    }
    figures = {name: table5(series, r, first, last) for name, r in runs.items()}
    f0, f1 = params.future_steps * 3 // 5, params.future_steps  # 3-5 h at the Philly settings
    smape = {
        "causal_3_5h": smape_at(series, causal, first, last, f0, f1),
        "causal_next_step": smape_at(series, causal, first, last, 1, 1),
        "artifact_series": forecast.smape(leaky_series[first:last], series.values[first:last]),
    }
    days = (last - first) * forecast.STEP_S / 86400.0
    section.text(
        f"**Setup (generated).** `{NODE_FILE}`: {len(series.values)} ten-minute steps "
        f"(maximum of each minute's busy-node count; {series.gaps} steps without samples "
        f"carry the previous value), {int(series.total.max())} nodes. The forecaster "
        f"(`masterd.core.helios.forecast`, the master's) trains on targets before "
        f"{study.train_end}, stops early on {study.train_end} to {study.valid_end} "
        f"({fit.rounds} rounds, {fit.train_rows} training rows, {fmt(fit_s, '{:.0f}')} s) and "
        f"forecasts {horizon} steps from every origin; the decisions "
        f"(`masterd.core.helios.ces`, Algorithm 2) step every 10 minutes from "
        f"{study.test_start} to {study.test_end} ({fmt(days, '{:.0f}')} days) with σ = "
        f"{params.buffer} nodes, {params.history_steps} steps of history (threshold "
        f"{fmt(params.history_threshold, '{:g}')}), {params.future_steps} steps ahead "
        f"(threshold {fmt(params.future_threshold, '{:g}')}), at least {params.min_decrease} "
        f"node per power-down and a cool-down of {params.cooldown_steps} steps — the "
        "artifact's Philly settings. Energy: 800 W per idle node, cooling twice the servers' "
        "energy (3 × 800 W per node powered down)."
    )
    t5 = section.table(Table(
        "ces-table5",
        ["metric", "Helios Table 5", "CES, causal forecast", "CES, artifact's features",
         "power down when idle"],
        ["{}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}"],
        caption=f"Theirs: {HELIOS_TABLE5['source']}; their vanilla figure is the Helios "
                "clusters' average. Ours: Philly, 1–14 December.",
        command="trellis-sim report --studies ces --no-ces-venus --out OUT",
    ))
    rows = (("avg nodes powered down", "nodes_powered_down_avg"),
            ("wake-ups a day", "wakeups_per_day"), ("nodes per wake-up", "nodes_per_wakeup"),
            ("node utilisation without CES %", "util_without_pct"),
            ("node utilisation with CES %", "util_with_pct"))
    for label, key in rows:
        t5.add(label, HELIOS_TABLE5[key], figures["causal"][key], figures["artifact"][key],
               figures["vanilla"][key])
    t5.add("wake-ups a day, vanilla", HELIOS_TABLE5["vanilla_wakeups_per_day"], None, None,
           figures["vanilla"]["wakeups_per_day"])
    t5.add("steps with fewer powered than busy nodes", None,
           figures["causal"]["steps_short_of_nodes"], figures["artifact"]["steps_short_of_nodes"],
           figures["vanilla"]["steps_short_of_nodes"])
    energy = section.table(Table(
        "ces-energy", ["", "Helios (Philly, Table 5 nodes)", "CES, causal", "CES, artifact's",
                       "power down when idle"],
        ["{}", "{:.0f}", "{:.0f}", "{:.0f}", "{:.0f}"],
        caption="Energy saved a year, MWh: avg nodes powered down × 800 W × 3 × 8760 h.",
        command="trellis-sim report --studies ces --no-ces-venus --out OUT",
    ))
    energy.add("MWh a year", energy_mwh(HELIOS_TABLE5["nodes_powered_down_avg"]),
               figures["causal"]["energy_saved_mwh_per_year"],
               figures["artifact"]["energy_saved_mwh_per_year"],
               figures["vanilla"]["energy_saved_mwh_per_year"])
    acc = section.table(Table(
        "ces-forecast", ["series", "forecast", "steps ahead", "SMAPE %"],
        ["{}", "{}", "{}", "{:.2f}"],
        caption="Forecast accuracy over the test period (Helios reports 3.6% for Earth, "
                "none for Philly).",
        command="trellis-sim report --studies ces --out OUT",
    ))
    acc.add("Philly busy nodes", "causal", f"{f0}–{f1} (3–5 h)", smape["causal_3_5h"])
    acc.add("Philly busy nodes", "causal", "1", smape["causal_next_step"])
    acc.add("Philly busy nodes", "artifact's features (leaky)", "series", smape["artifact_series"])
    venus: dict[str, Any] = {}
    if study.venus:
        venus = _venus(study, trace_dir)
        acc.add("Venus GPUs in use (derived)", "causal",
                f"1–{study.venus_future_steps} (up to 3 h)", venus["causal_smape"])
        acc.add("Venus GPUs in use (derived)", "artifact's features (leaky)", "series",
                venus["artifact_smape"])
    _plot(section, out_dir, series, runs["causal"], causal, first, last)
    section.data = {
        "config": asdict(study), "paper": HELIOS_TABLE5, "results": figures, "smape": smape,
        "fit": {"rounds": fit.rounds, "train_rows": fit.train_rows,
                "valid_rows": fit.valid_rows, "seconds": fit_s},
        "venus": venus, "gaps": series.gaps,
    }
    section.wall_s = time.monotonic() - started
    return section


def _venus(study: CesStudy, trace_dir: Path) -> dict[str, Any]:
    series = load_venus(trace_dir / VENUS_FILE)
    train_end = series.index(_stamp(study.venus_train_end))
    valid_end = series.index(_stamp(study.venus_valid_end))
    last = min(series.index(_stamp(study.venus_test_end)), len(series.values))
    horizon = study.venus_future_steps
    forecasts, fit = causal_forecasts(series, train_end, valid_end, valid_end, last, horizon,
                                      study.max_rounds)
    leaky = fit_artifact(series, train_end, valid_end, study.max_rounds)
    return {"steps": len(series.values), "rounds": fit.rounds,
            "causal_smape": smape_at(series, forecasts, valid_end, last, 1, horizon),
            "artifact_smape": forecast.smape(leaky[valid_end:last],
                                             series.values[valid_end:last])}


def _plot(section: Section, out_dir: Path, series: Series, run: CesRun, forecasts: np.ndarray,
          first: int, last: int) -> None:
    plt = pyplot()
    if plt is None:
        return
    days = (series.times[first:last] - series.times[first]) / 86400.0
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    ax.plot(days, series.values[first:last], label="busy (trace)", linewidth=1.0)
    ax.plot(days, forecasts[:, 17] if forecasts.shape[1] > 17 else forecasts[:, -1],
            label="forecast 3 h earlier", linewidth=0.8, linestyle="--")
    ax.plot(days, run.powered, label="powered (CES)", linewidth=1.2)
    ax.plot(days, series.total[first:last], label="total", linewidth=1.0)
    ax.set_xlabel("days from the start of the test fortnight")
    ax.set_ylabel("nodes")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=4, loc="lower center")
    save_figure(plt, fig, out_dir / "ces_philly_nodes.png")
    section.figures.append(("ces_philly_nodes.png", "Philly, 1–14 December: busy, forecast, "
                            "powered and total nodes under CES with the causal forecast "
                            "(cf. Helios Fig. 15)."))


STUDY = Study(name="ces", label="CES (Helios)", config=CesStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options)
