"""``trellisctl share`` and ``report``: fair share and accounting (docs/governance.md)."""

from __future__ import annotations

import argparse
import time

from control.tables import render_table
from control.usage import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from control.client import MasterClient

GROUPINGS = ("account", "user", "gpu-model")
END_STATES = ("finished", "failed", "cancelled", "timeout", "node_lost")


def add_share(p: argparse.ArgumentParser, _: Any) -> None:
    p.description = ("Each account's shares, normalised share, decayed usage, effective usage "
                     "and fair-share factor (1: used nothing; 0.5: used exactly its share).")


def add_report(p: argparse.ArgumentParser, _: Any) -> None:
    p.description = ("GPU-hours allocated and busy, jobs by end state, wait p50/p95 and "
                     "requeues over a window, from the master's journal.")
    p.add_argument("--by", choices=GROUPINGS, default="account", help="group rows by this")
    p.add_argument("--since", metavar="TIME",
                   help="start of the window: an ISO time (2030-01-31, 2030-01-31T18:00; local "
                        "unless it has a zone) or an age (90m, 12h, 7d ago); default 30 days "
                        "before --until")
    p.add_argument("--until", metavar="TIME", help="end of the window (same forms); default now")


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_when(text: str, flag: str, now: float) -> float:
    """Unix seconds from an ISO time or an age ("7d": seven days ago)."""
    raw = text.strip()
    if raw and raw[-1] in _UNITS:
        try:
            age = float(raw[:-1]) * _UNITS[raw[-1]]
        except ValueError:
            age = -1.0
        if age >= 0 and age != float("inf"):
            return now - age
    if raw == "now":
        return now
    import datetime

    try:
        return datetime.datetime.fromisoformat(raw).timestamp()
    except ValueError:
        raise UsageError(f"{flag} {text!r}: neither an ISO time (2030-01-31T18:00) nor an age "
                         "(90m, 12h, 7d)") from None


def run_share(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    result = client.call("share")
    if args.output == "csv":
        return result, to_csv(result["accounts"], ["account", "parent", "shares", "norm_shares",
                                                   "raw_usage", "norm_usage",
                                                   "effective_usage", "factor"])
    return result, show_share(result)


def show_share(result: dict[str, Any]) -> str:
    rows = result["accounts"]
    depth: dict[str, int] = {}
    table = []
    for row in rows:
        depth[row["account"]] = depth.get(row["parent"], -1) + 1 if row["parent"] else 0
        table.append(["  " * depth[row["account"]] + row["account"], f"{row['shares']:g}",
                      f"{row['norm_shares']:.4f}", f"{row['raw_usage']:.2f}",
                      f"{row['effective_usage']:.4f}", f"{row['factor']:.4f}"])
    header = ["ACCOUNT", "SHARES", "NORM_SHARES", "USAGE", "EFFECTIVE_USAGE", "FAIRSHARE"]
    text = render_table(header, table) if table else "no accounts with jobs yet"
    weights = result["weights"]
    return (f"{text}\nusage: GPU-hour equivalents (gpu {weights['gpu']:g}, cpu "
            f"{weights['cpu']:g}, memory {weights['memory_gib']:g} per GiB, per hour), half-life "
            f"{result['half_life_s'] / 86400:g} d; ordering "
            f"{'on' if result['order'] else 'off'}")


def run_report(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    now = time.time()
    params: dict[str, Any] = {"by": args.by}
    if args.until is not None:
        params["until"] = parse_when(args.until, "--until", now)
    if args.since is not None:
        params["since"] = parse_when(args.since, "--since", now)
    if "since" in params and "until" in params and params["until"] <= params["since"]:
        raise UsageError("--until must be after --since")
    result = client.call("report", params)
    key = args.by.replace("-", "_")
    if args.output == "csv":
        columns = [key, "gpu_hours_allocated", "gpu_hours_busy", "gpu_hours_measured",
                   *(f"jobs_{s}" for s in END_STATES), "running", "started", "wait_p50_s",
                   "wait_p95_s", "requeues"]
        flat = [{**row, **{f"jobs_{s}": row["jobs"].get(s, 0) for s in END_STATES}}
                for row in result["rows"]]
        return result, to_csv(flat, columns)
    return result, show_report(result, key)


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def show_report(result: dict[str, Any], key: str) -> str:
    table = []
    for row in result["rows"]:
        jobs = row["jobs"]
        table.append([row[key], _num(row["gpu_hours_allocated"], ".2f"),
                      _num(row["gpu_hours_busy"], ".2f"), str(jobs.get("finished", 0)),
                      str(jobs.get("failed", 0)), str(jobs.get("cancelled", 0)),
                      str(jobs.get("timeout", 0)), str(jobs.get("node_lost", 0)),
                      str(row["running"]), _num(row["wait_p50_s"]), _num(row["wait_p95_s"]),
                      str(row["requeues"])])
    header = [key.upper(), "GPU_H", "GPU_H_BUSY", "FINISHED", "FAILED", "CANCELLED", "TIMEOUT",
              "NODE_LOST", "RUNNING", "WAIT_P50_S", "WAIT_P95_S", "REQUEUES"]
    window = (f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(result['since']))} .. "
              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(result['until']))}")
    if not table:
        return f"nothing ran in {window}"
    return f"{render_table(header, table)}\nwindow: {window}"


def to_csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    return out.getvalue().rstrip("\n")
