"""``trellis-sim train sched2``: the command line of the trainer (imports torch only when run)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.workloads.sched2 import Sched2Options

AGENTS = ("sched2", "sched2-scorer")
TORCH_HINT = ("training needs PyTorch, the optional extra 'rl': pip install -e '.[rl]' "
              "(torch==2.13.0, a CPU build)")


class TrainUsageError(ValueError):
    """A bad training option, reported in one sentence."""


def add_parser(sub: Any, trace_default: str) -> argparse.ArgumentParser:
    train: argparse.ArgumentParser = sub.add_parser(
        "train", help="train SCHED²'s agent in the simulator (needs torch)")
    train.add_argument("agent", choices=AGENTS)
    train.add_argument("--trace", help=f"trace directory with philly-jobs.csv "
                       f"(default {trace_default})")
    train.add_argument("--episodes", type=int, default=100, help="training episodes")
    train.add_argument("--seed", type=int, default=1)
    train.add_argument("--out", required=True, help="the weights, e.g. model.npz (the curve "
                       "and the record go beside it as .png and .json)")
    train.add_argument("--mix", default="0.68",
                       help="share of one-GPU jobs (0.68: the paper's), or 'philly' as it is")
    train.add_argument("--jobs", type=int, default=1000, help="jobs per episode")
    train.add_argument("--servers", type=int, default=15)
    train.add_argument("--gpus-per-server", type=int, default=8)
    train.add_argument("--mean-gap", type=float, default=172.0,
                       help="mean inter-arrival time, seconds")
    train.add_argument("--window", type=int, default=10, help="J: waiting jobs the agent sees")
    train.add_argument("--eval-every", type=int, default=10,
                       help="episodes between greedy evaluations (the best export is kept)")
    train.add_argument("--load", type=float, default=None,
                       help="expected offered load (default: the paper's implied 0.69)")
    train.add_argument("--loads", metavar="L1,L2,...",
                       help="draw each training episode's offered load from these (seeded)")
    train.add_argument("--eval-loads", metavar="L1,L2,...",
                       help="loads of the greedy evaluations that choose the export "
                       "(default: the first training load)")
    train.add_argument("--paper-state", action="store_true",
                       help="Table I's state only: no packing feature, servers by name")
    train.add_argument("--imitate", type=int, default=4, metavar="EPISODES",
                       help="warm start: episodes acted by the hold rule, learned as "
                       "demonstrations (0: none; needs the packing feature)")
    train.add_argument("--pretrain-steps", type=int, default=2000,
                       help="gradient steps on the demonstrations before the agent acts")
    train.add_argument("--time-constant", type=float, default=3600.0, metavar="SECONDS",
                       help="τ of the elapsed-time discount e^(-Δt/τ) (0: per decision only)")
    train.add_argument("--lr", type=float, default=5e-4, help="Adam's learning rate")
    train.add_argument("--margin", type=float, default=0.1,
                       help="DQfD's margin for the demonstrated actions")
    train.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return train


def options(args: argparse.Namespace) -> Sched2Options:
    if args.mix == "philly":
        share: float | None = None
    else:
        try:
            share = float(args.mix)
        except ValueError:
            raise TrainUsageError(f"--mix {args.mix!r}: a share in [0, 1] or 'philly'") from None
    try:
        base = Sched2Options()
        return replace(base, one_gpu_share=share, jobs=args.jobs,
                       servers=args.servers, gpus_per_server=args.gpus_per_server,
                       mean_gap_s=args.mean_gap, seed=args.seed,
                       load=base.load if getattr(args, "load", None) is None else args.load)
    except ValueError as exc:
        raise TrainUsageError(str(exc)) from None


def _loads(text: str | None, flag: str) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise TrainUsageError(f"{flag} {text!r}: comma-separated loads, e.g. 0.5,0.69,1.0") \
            from None
    if any(not 0 < v <= 5 for v in values):
        raise TrainUsageError(f"{flag} {text!r}: every load must be in (0, 5]")
    return values


def run(args: argparse.Namespace, trace_dir: Path, command: str) -> int:
    opts = options(args)
    try:
        from sim.rl.train import TrainConfig, train
    except ImportError as exc:
        if "torch" not in str(exc):
            raise
        raise TrainUsageError(TORCH_HINT) from None
    from sim.rl.dqn import DqnConfig
    if args.time_constant < 0:
        raise TrainUsageError(f"--time-constant must be >= 0, got {args.time_constant}")
    fixes = not args.paper_state
    if args.agent == "sched2-scorer" and not fixes:
        raise TrainUsageError("--paper-state is the paper's agent's state; the scorer's has "
                              "the packing feature")
    loads, eval_loads = _loads(args.loads, "--loads"), _loads(args.eval_loads, "--eval-loads")
    if not (args.lr > 0 and args.margin >= 0):
        raise TrainUsageError(f"--lr must be > 0 and --margin >= 0, got {args.lr}, "
                              f"{args.margin}")
    dqn = DqnConfig(time_constant_s=args.time_constant, lr=args.lr, margin=args.margin)
    if args.imitate and fixes:
        # Started from the rule: explore around it rather than from scratch.
        dqn = replace(dqn, eps_start=0.2, eps_end=0.02)
    try:
        config = TrainConfig(trace_dir=trace_dir, out=Path(args.out), episodes=args.episodes,
                             seed=args.seed, options=opts, window=args.window,
                             eval_every=args.eval_every, command=command, dqn=dqn,
                             packing=fixes, canonical=fixes,
                             imitate_episodes=args.imitate if fixes else 0,
                             pretrain_steps=args.pretrain_steps if fixes else 0,
                             agent=args.agent, loads=loads, eval_loads=eval_loads)
    except ValueError as exc:
        raise TrainUsageError(str(exc)) from None
    if config.window < 1:
        raise TrainUsageError(f"--window must be at least 1, got {config.window}")

    def show(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    result = train(config, show)
    chosen = result.record["chosen"]
    print(f"trained {args.episodes} episodes in {result.record['seconds']:.0f} s; kept the "
          f"export after episode {chosen['episode']} (greedy effectiveness "
          f"{chosen['effectiveness']:.3f} on training episodes {list(config.eval_episodes)})")
    for path in result.written:
        print(f"wrote {path}")
    return 0
