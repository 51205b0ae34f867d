"""trellisctl's Helios commands: ``estimator`` (QSSF's duration estimator: accuracy and last
training; ``--train`` retrains now) and ``power`` (Cluster Energy Saving), and the estimate
part of ``show``."""

from __future__ import annotations

import argparse
import time

from control.client import MasterClient

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def add_estimator(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("--train", action="store_true", help="retrain the model now (in the "
                   "master's worker process), then show the estimator")


def add_power(p: argparse.ArgumentParser, _: Any) -> None:
    """No options: ``trellisctl power`` shows the energy saver's state."""


def show_estimate(estimate: dict[str, Any] | None) -> list[str]:
    """``show``'s lines for QSSF's estimate of a job: the blend and both parts' sources."""
    if not estimate:
        return []
    rolling = estimate.get("rolling_s")
    lines = [f"{'Estimate:':<12}{_s(estimate.get('value_s'))} (priority "
             f"{_s(estimate.get('priority_gpu_s'))} GPU-time; alpha {estimate['alpha']:g} x "
             f"rolling + {1 - estimate['alpha']:g} x ML)",
             f"{'  rolling:':<12}{_s(rolling)} from {estimate.get('rolling_source') or 'none'}"
             + (f" ({', '.join(estimate['matched'])})" if estimate.get("matched") else ""),
             f"{'  ML:':<12}{_s(estimate.get('ml_s'))} from "
             f"{estimate.get('ml_source') or 'none (no model yet)'}"]
    return lines


def show_estimator(result: dict[str, Any]) -> str:
    acc = result["accuracy"]
    last = result.get("last_training") or {}
    lines = [
        f"{'History:':<16}{result['history_jobs']} finished jobs; alpha {result['alpha']:g}",
        f"{'Model:':<16}{result.get('model_source') or 'none (rolling estimate only)'}",
        f"{'Last training:':<16}{_when(last.get('time'))}"
        + (f" error: {last['error']}" if "error" in last else "")
        + (f" skipped: {last['skipped']}" if "skipped" in last else "")
        + (f" on {last['jobs']} jobs in {last['seconds']:.1f}s" if "jobs" in last else ""),
        f"{'Accuracy:':<16}over the last {acc['jobs']} finished jobs",
    ]
    for part in ("estimate", "rolling", "ml"):
        lines.append(f"  {part + ':':<14}MAE {_s(acc[f'{part}_mae_s'])}, mean relative error "
                     f"{_pct(acc[f'{part}_mean_relative_error'])}")
    return "\n".join(lines)


def show_power(result: dict[str, Any]) -> str:
    c = result["counts"]
    lines = [
        f"{'Nodes:':<16}{c['total']} total, {c['busy']} busy, {c['powered_down']} powered "
        f"down, {c['powering_down']} powering down, {c['powering_up']} powering up",
        f"{'Wake-ups:':<16}{result['wakeups']} ({result['nodes_woken']} nodes); program "
        f"failures {result['failures']}",
        f"{'Saved:':<16}{result['node_hours_saved']:.2f} node-hours powered down",
        f"{'Forecaster:':<16}{result.get('forecaster') or 'none yet (trend only)'}",
    ]
    decision = result.get("last_decision")
    if decision:
        lines.append(f"{'Last check:':<16}{_when(decision['time'])} busy {decision['busy']}, "
                     f"powered {decision['powered']} -> {decision['target']}")
    for node, state in result.get("nodes", {}).items():
        lines.append(f"  {node:<20}{state}")
    return "\n".join(lines)


def run_helios(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str] | None:
    if args.command == "estimator":
        if args.train:
            client.call("estimator_train")
        result = client.call("estimator")
        return result, show_estimator(result)
    if args.command == "power":
        result = client.call("power")
        return result, show_power(result)
    return None
