"""The chaos soak: users, a nemesis and a checker that trusts only evidence.

    python bench/chaos.py --minutes 30 [--seed N] [--masters 3] [--nodes 6] [--keep]

Root only (network namespaces, cgroups, tmpfs). Three masters on PostgreSQL and six node
daemons (real cgroups, emulated GPUs), every one of them and PostgreSQL in a network
namespace of its own; four users with their own credentials submit single jobs, arrays,
multi-node jobs, dependency chains, jobs that outlive their time limits, holds and updates,
jobs that fail, ``trellisctl run --pty`` sessions typed into through a pseudo-terminal, and
cancel at random moments (also while a job is being placed, started or requeued). A seeded
nemesis meanwhile kills, freezes and cuts off masters, cuts nodes off, kills node daemons
with and without their jobs, restarts PostgreSQL, raises fatal and application Xids, fills a
node's log disk and fires bursts of hostile RPCs; faults overlap. A supervisor restarts what
was killed, as systemd would. Then the nemesis stops, the cluster heals, every job ends, and
the checker (bench/chaoskit/checker.py) judges the history of client operations and the
evidence the jobs wrote themselves against Trellis's promises.

Last line JSON: ``seconds``, ``faults`` by kind, ``operations``, ``jobs``, ``violations`` by
invariant (all 0), ``acked_lost``, ``seed``. A failing run (a violation, fewer faults than
``--min-faults`` (default 10 a minute), a 5xx to a hostile request, or a cluster that did not
heal) exits 1 and leaves its history, the jobs' evidence and every daemon's log in the
directory it names (``kept``), to replay with the same seed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaoskit.soak import SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=8.0,
                        help="how long the nemesis and the users run (default 8: the quick form)")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--mean-gap", type=float, default=4.0,
                        help="mean seconds between the starts of two faults")
    parser.add_argument("--min-faults", type=int, default=None,
                        help="fail unless at least this many faults were injected "
                             "(default: 10 a minute)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where a failing run leaves its history and logs")
    parser.add_argument("--keep", action="store_true", help="keep them for a passing run too")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the soak needs root (network namespaces, cgroups, tmpfs)")
    if args.minutes <= 0 or args.masters < 2 or args.nodes < 2:
        parser.error("--minutes must be positive, --masters and --nodes at least 2")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    print(f"chaos: seed {seed}, {args.minutes:g} min, {args.masters} masters, {args.nodes} "
          "nodes", file=sys.stderr, flush=True)
    result = run_soak(SoakConfig(minutes=args.minutes, seed=seed, masters=args.masters,
                                 nodes=args.nodes, mean_gap_s=args.mean_gap,
                                 min_faults=args.min_faults, out=args.out, keep=args.keep))
    for example in result.get("violation_examples", []):
        print(f"violation: {example}", file=sys.stderr)
    print(json.dumps(result), flush=True)
    return 1 if result.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
