"""What ``trellis-sim run --workload philly`` replays when the user names no cluster.

The trace's VCs as ``philly-vcs.csv`` sizes them, or all of them on one cluster, carry so
little of the trace's work that no job waits and every policy gives the same numbers. Unless
the user chooses the cluster (``--nodes``, ``--per-vc`` or ``--vc-scale``), the
run therefore takes the setup of the Philly study (``sim.studies.philly``, Helios §4.2.3):
each VC on its own nodes at the VC scale the study's search finds, Helios' evaluation window,
every job running its recorded duration, and Helios' rules for FIFO, SJF and QSSF where the
user gave those policies no options. The run says so in one line, with how to leave it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from sim.studies.philly import ALIGNED, PhillyStudy

# The VC scale the Philly study's search finds (seed 1): FIFO's node utilisation there is
# 69.9 %, against the 69.0 % Helios reports for Philly (Table 5). docs/results.md shows the
# search; a different trace directory may want another scale (--vc-scale).
HELIOS_VC_SCALE = 0.2125
DEFAULT_NOISE = 0.03  # the truth's per-job speed noise when the user does not set --noise


def chose_cluster(args: argparse.Namespace) -> bool:
    return args.nodes is not None or bool(args.per_vc) or args.vc_scale is not None


def apply_helios_setup(args: argparse.Namespace) -> str | None:
    """Fill in the study's setup where the user left it out (in ``args``); the sentence that
    tells the user, or None when the user chose the cluster (nothing is changed then)."""
    if args.workload != "philly" or chose_cluster(args):
        return None
    study = PhillyStudy()
    args.per_vc = True
    args.vc_scale = HELIOS_VC_SCALE
    window = args.since is None and args.until is None
    if window:
        args.since, args.until = study.since, study.until
    # Each says what this changes; the user's own --noise or --no-interference is not news.
    changed = [what for what, unset in (("no noise", args.noise is None),
                                        ("no interference", not args.no_interference))
               if unset]
    if args.noise is None:
        args.noise = 0.0
    args.no_interference = True
    parts = [f"each VC on its own nodes at VC scale {HELIOS_VC_SCALE:g}"]
    if window:
        parts.append(f"jobs submitted {study.since} to {study.until}")
    if len(changed) == 2:
        parts.append("every job runs its recorded duration (no noise, no interference)")
    elif changed:
        parts.append(changed[0])
    return ("philly: no cluster given, so this is the Helios study's setup ("
            + "; ".join(parts) + "; Helios' rules for fifo, sjf and qssf without options of "
            "your own). For other loads: --per-vc --vc-scale S (more nodes: less waiting), or "
            "--nodes N for the whole trace on one cluster.")


def helios_policy_options(
    policies: list[str], given: Mapping[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Helios' rules (consolidated placement; SJF by recorded duration, no backfill) for the
    policies the user gave no options, the user's own options untouched."""
    return {name: (dict(given.get(name) or {}) or dict(ALIGNED.get(name, {})))
            for name in policies}


def nothing_waited(summaries: list[dict[str, Any]]) -> str | None:
    """A warning when no job of any run waited: then the policies cannot differ."""
    if not summaries or any((s.get("queued_jobs") or 0) > 0 for s in summaries):
        return None
    utils = [s["node_utilisation"] for s in summaries if s.get("node_utilisation") is not None]
    util = f" (node utilisation {100 * max(utils):.1f} % at most)" if utils else ""
    return ("note: no job waited in any run" + util + ", so every policy places every job "
            "at once and they cannot differ. Load the cluster: fewer nodes (--nodes, "
            "--cluster), philly --per-vc --vc-scale below 1, or openb --arrival-scale above 1.")
