"""Helios' Cluster Energy Saving on Philly's node activity (Table 5), with the master's own
forecaster and decision modules.

    python bench/ces_replay.py [--trace DIR] [--buffer 20]

Trains the strictly causal forecaster on the steps before November (early stopping on
November), steps Algorithm 2 every 10 minutes over 1-14 December, and replays the
power-down-when-idle baseline over the same fortnight. Prints the figures of both and of the
artifact's leaky features, then, last, one JSON line: nodes_powered_down_avg, wakeups_per_day,
nodes_per_wakeup, util_without_pct, util_with_pct, smape_pct (3-5 h ahead),
baseline_wakeups_per_day, seconds (plus the leaky variant's figures under artifact_*).
Paper (Helios Table 5, Philly): 100.1, 0.5, 27.1, 69.0 -> 90.4%; a vanilla policy 34.1 wake-ups
a day (Helios clusters).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from sim.studies import ces


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(Path(__file__).resolve().parents[2] / "shared"
                                               / "traces"))
    parser.add_argument("--buffer", type=int, default=20)
    parser.add_argument("--no-artifact", action="store_true",
                        help="skip the artifact's (leaky) features")
    args = parser.parse_args()
    started = time.monotonic()
    study = replace(ces.CesStudy(), buffer=args.buffer)
    params = study.params
    series = ces.load_node_sequence(Path(args.trace) / ces.NODE_FILE)
    stamp = ces._stamp
    train_end, valid_end = series.index(stamp(study.train_end)), series.index(
        stamp(study.valid_end))
    first = series.index(stamp(study.test_start))
    last = min(series.index(stamp(study.test_end)), len(series.values))
    horizon = 2 * params.future_steps
    forecasts, fit = ces.causal_forecasts(series, train_end, valid_end, first, last, horizon,
                                          study.max_rounds)
    print(f"forecaster: {fit.rounds} rounds on {fit.train_rows} rows", flush=True)
    causal = ces.table5(series, ces.replay(series, params, first, last, forecasts), first, last)
    vanilla = ces.table5(series, ces.replay(series, params, first, last, None, vanilla=True),
                         first, last)
    f0, f1 = params.future_steps * 3 // 5, params.future_steps
    smape = ces.smape_at(series, forecasts, first, last, f0, f1)
    for label, figures in (("CES, causal", causal), ("power down when idle", vanilla)):
        print(f"{label}: " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in figures.items()), flush=True)
    extra: dict[str, object] = {}
    if not args.no_artifact:
        leaky = ces.fit_artifact(series, train_end, valid_end, study.max_rounds)
        windows = np.array([np.pad(leaky[i:i + horizon], (0, max(0, i + horizon - len(leaky))),
                                   mode="edge") for i in range(first, last)])
        artifact = ces.table5(series, ces.replay(series, params, first, last, windows), first,
                              last)
        print("CES, artifact's features: " + ", ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in artifact.items()), flush=True)
        extra = {f"artifact_{k}": v for k, v in artifact.items()}
        extra["artifact_smape_pct"] = ces.forecast.smape(leaky[first:last],
                                                         series.values[first:last])
    return {
        "nodes_powered_down_avg": causal["nodes_powered_down_avg"],
        "wakeups_per_day": causal["wakeups_per_day"],
        "nodes_per_wakeup": causal["nodes_per_wakeup"],
        "util_without_pct": causal["util_without_pct"],
        "util_with_pct": causal["util_with_pct"],
        "smape_pct": smape,
        "baseline_wakeups_per_day": vanilla["wakeups_per_day"],
        "seconds": time.monotonic() - started,
        "energy_saved_mwh_per_year": causal["energy_saved_mwh_per_year"],
        "baseline_nodes_powered_down_avg": vanilla["nodes_powered_down_avg"],
        **extra,
    }


if __name__ == "__main__":
    print(json.dumps(main()))
