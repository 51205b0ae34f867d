"""Training SCHED²'s agent in the simulator (seeds/sched2.md §III-F, §IV-A "RL details").

Each episode replays one of the 30 training episodes of the workload (``sim.workloads.sched2``,
visited in a seeded random order, every one once per round) through the master's own
scheduling core, with the ``sched2`` policy consulting the learning agent
(``sim.rl.dqn.TrainingAgent``): the same state, packing, rewards and frozen-time loop the
master serves with. Ground truth as the paper's profile-driven simulator: no noise, no
interference, only the locality penalty; the policy's predictions come from the oracle model
database (exact profiles, §III-B).

Every ``eval_every`` episodes the network is exported and replayed greedily — with numpy, as
the master runs it — on a few *training* episodes (the held-out ones stay unseen); the export
with the best mean effectiveness is the result. Written next to ``out``: the weights
(``.npz``), the training curve (``.png``) and the record of the run (``.json``: the command,
configuration, seconds, every episode's reward and every evaluation).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from masterd.core.policies.sched2 import Sched2Policy
from masterd.core.policies.sched2_scorer import Sched2ScorerPolicy
from masterd.core.sched2.agent import HoldAgent, ScorerHoldAgent
from masterd.core.sched2.network import QNetwork, Shape, random_network
from masterd.core.sched2.scorer import ScorerNetwork, ScorerShape, random_scorer
from sim.engine import SimConfig, simulate
from sim.oracle import oracle_modeldb
from sim.rl.dqn import DqnConfig, DqnLearner, TrainingAgent
from sim.rl.qnet import QNetCodec
from sim.rl.scorer_net import ScorerCodec
from sim.sched2_metrics import episode_metrics
from sim.truth import TruthConfig, TruthModel
from sim.workloads import sched2 as workload
from sim.workloads.base import Workload

log = logging.getLogger("trellis.sim.rl")

# The paper's profile-driven simulator: a job's speed depends on its placement only.
TRUTH = TruthConfig(noise_sigma=0.0, interference=False)
SCORER = "sched2-scorer"
AGENTS = ("sched2", SCORER)


@dataclass(frozen=True)
class TrainConfig:
    trace_dir: Path
    out: Path
    episodes: int = 100
    seed: int = 1
    options: workload.Sched2Options = field(default_factory=workload.Sched2Options)
    window: int = 10  # J
    profiles: int = 4  # k
    time_scale: float = 3600.0
    train_episodes: tuple[int, ...] = tuple(workload.TRAIN_EPISODES)
    eval_every: int = 10
    eval_episodes: tuple[int, ...] = (0, 1, 2)  # training episodes, for choosing the export
    dqn: DqnConfig = field(default_factory=DqnConfig)
    decisions_per_episode: int = 3000  # a guess for the ε/β schedules; corrected after one
    command: str = ""
    # The learning fixes (docs/policies/sched2.md): the packing feature and canonical server
    # order in the state, and a warm start imitating the hold rule for ``imitate_episodes``
    # episodes followed by ``pretrain_steps`` gradient steps on what it showed.
    packing: bool = False
    canonical: bool = False
    imitate_episodes: int = 0
    pretrain_steps: int = 0
    # "sched2": the paper's agent over a window of J; "sched2-scorer": the per-job scorer
    # over the whole queue (beyond the paper).
    agent: str = "sched2"
    # Offered loads the training episodes are drawn at (each episode one, seeded); empty:
    # ``options.load`` only. ``eval_loads``: the loads of the greedy evaluations (empty:
    # the training loads' first).
    loads: tuple[float, ...] = ()
    eval_loads: tuple[float, ...] = ()
    stored_candidates: int = 128  # the scorer's candidates kept per stored decision

    def __post_init__(self) -> None:
        if self.agent not in AGENTS:
            raise ValueError(f"agent must be one of {', '.join(AGENTS)}, got {self.agent!r}")
        if self.agent == SCORER and not self.packing:
            raise ValueError("the scorer's state always has the packing feature")
        if self.episodes < 1:
            raise ValueError(f"episodes must be at least 1, got {self.episodes}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be at least 1, got {self.eval_every}")
        if not self.train_episodes:
            raise ValueError("no training episodes")
        if self.imitate_episodes < 0 or self.pretrain_steps < 0:
            raise ValueError("imitate_episodes and pretrain_steps must be >= 0")
        if self.imitate_episodes and not self.packing:
            raise ValueError("imitating the hold rule needs the packing feature")
        if self.imitate_episodes >= self.episodes:
            raise ValueError(f"imitate_episodes ({self.imitate_episodes}) must be fewer than "
                             f"episodes ({self.episodes})")


@dataclass
class TrainResult:
    network: QNetwork | ScorerNetwork
    record: dict[str, Any]
    written: list[Path]


def environment(config: TrainConfig) -> tuple[Callable[[int, float | None], Workload], Any]:
    """Episodes by (index, offered load), built once each, and the oracle model database."""
    truth = TruthModel(TRUTH)
    built: dict[tuple[int, float | None], Workload] = {}

    def get(index: int, load: float | None = None) -> Workload:
        key = (index, config.options.load if load is None else load)
        if key not in built:
            built[key] = workload.episode(config.trace_dir, replace(config.options, load=key[1]),
                                          index, truth)
        return built[key]

    return get, oracle_modeldb(TRUTH, workload.GPU_MODEL)


def make_policy(network: QNetwork | ScorerNetwork, modeldb: Any, agent: Any = None) -> Any:
    """The policy that serves ``network`` (the agent's seat taken by ``agent`` if given)."""
    if isinstance(network, ScorerNetwork):
        return Sched2ScorerPolicy(model=network, modeldb=modeldb, agent=agent)
    return Sched2Policy(model=network, modeldb=modeldb, agent=agent)


def evaluate(network: QNetwork | ScorerNetwork, episodes: Sequence[Workload], modeldb: Any,
             gpus_per_server: int, agent: Any = None) -> dict[str, float]:
    """Greedy replays of ``episodes`` with the numpy network: mean metrics."""
    rows = []
    for w in episodes:
        result = simulate(w, make_policy(network, modeldb, agent),
                          SimConfig(seed=1, truth=TRUTH, sample_interval=1e12))
        rows.append(episode_metrics(w, result, gpus_per_server))
    return {
        "effectiveness": float(np.mean([r.effectiveness for r in rows])),
        "jct_s": float(np.mean([r.jct_s for r in rows])),
        "makespan_s": float(np.mean([r.makespan_s for r in rows])),
        "unfinished": float(np.mean([r.unfinished for r in rows])),
    }


def evaluate_rule(config: TrainConfig, shape: Shape, episodes: Sequence[Workload],
                  modeldb: Any) -> dict[str, float]:
    """The hold rule in the agent's seat on ``episodes``: the score to beat."""
    m = config.options.gpus_per_server
    if config.agent == SCORER:
        rule: Any = ScorerHoldAgent(shape.profiles)
        return evaluate(random_scorer(ScorerShape(m, shape.profiles)), episodes, modeldb, m,
                        agent=rule)
    return evaluate(random_network(shape), episodes, modeldb, m, agent=HoldAgent(shape))


def train(config: TrainConfig, progress: Callable[[str], None] | None = None) -> TrainResult:
    torch.set_num_threads(1)  # small networks: threads cost more than they give
    started = time.monotonic()
    get, modeldb = environment(config)
    opts = config.options
    shape = Shape(opts.servers, opts.gpus_per_server, config.window, config.profiles,
                  packing=config.packing, canonical=config.canonical)
    codec: Any = (ScorerCodec(ScorerShape(opts.gpus_per_server, config.profiles), opts.servers,
                              config.stored_candidates)
                  if config.agent == SCORER else QNetCodec(shape))
    learner = DqnLearner(codec, config.dqn, config.seed)
    own_episodes = config.episodes - config.imitate_episodes
    rule: Any = ScorerHoldAgent(config.profiles) if config.agent == SCORER else HoldAgent(shape)
    teacher = rule.act if config.imitate_episodes else None
    agent = TrainingAgent(learner, own_episodes * config.decisions_per_episode, config.seed,
                          teacher=teacher)
    meta = {"trained_on": asdict(opts), "episodes": config.episodes, "seed": config.seed,
            "command": config.command, "imitate_episodes": config.imitate_episodes,
            "loads": list(config.loads), "agent": config.agent}
    order = random.Random(f"{config.seed}/sched2-train/order")
    loads = random.Random(f"{config.seed}/sched2-train/loads")
    queue: list[int] = []
    history: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    eval_loads = config.eval_loads or (config.loads[:1] if config.loads else (None,))
    eval_set = [get(i, load) for load in eval_loads for i in config.eval_episodes]
    teacher_score = (evaluate_rule(config, shape, eval_set, modeldb) if config.packing
                     else None)
    meta["hold_rule_on_eval_episodes"] = teacher_score
    best: tuple[float, QNetwork | ScorerNetwork] | None = None
    for e in range(config.episodes):
        if not queue:
            queue = list(config.train_episodes)
            order.shuffle(queue)
        index = queue.pop()
        load = loads.choice(config.loads) if config.loads else None
        w = get(index, load)
        if agent.teaching and e == config.imitate_episodes:
            # The rule has shown enough: fit what it showed, then the agent acts itself.
            for _ in range(config.pretrain_steps):
                learner.step(config.dqn.beta_start)
            agent.teaching = False
        policy = make_policy(codec.export(learner.online, config.time_scale, meta), modeldb,
                             agent)
        # No utilisation samples while training: nothing reads them, and they cost.
        result = simulate(w, policy, SimConfig(seed=config.seed, truth=TRUTH,
                                               sample_interval=1e12))
        reward = agent.end_episode()
        if e == 0 and agent.decisions:  # now the schedules know an episode's length
            agent.total = agent.decisions * own_episodes
        m = episode_metrics(w, result, opts.gpus_per_server)
        history.append({"episode": e, "trace_episode": index, "reward": reward,
                        "load": load if load is not None else opts.load,
                        "offered_load": w.notes.get("offered_load"),
                        "effectiveness": m.effectiveness, "jct_s": m.jct_s,
                        "unfinished": m.unfinished, "epsilon": agent.epsilon,
                        "decisions": agent.decisions, "steps": learner.steps,
                        "loss": float(np.mean(learner.losses[-200:])) if learner.losses else None,
                        "seconds": time.monotonic() - started})
        if progress is not None:
            progress(f"episode {e + 1}/{config.episodes} (trace {index}): reward {reward:.1f} "
                     f"effectiveness {m.effectiveness:.3f} ε {agent.epsilon:.2f} "
                     f"{time.monotonic() - started:.0f}s")
        if ((e + 1) % config.eval_every == 0 or e + 1 == config.episodes
                or (config.imitate_episodes and e + 1 == config.imitate_episodes + 1)):
            network = codec.export(learner.online, config.time_scale, meta)
            score = evaluate(network, eval_set, modeldb, opts.gpus_per_server)
            evaluations.append({"episode": e + 1, **score})
            if progress is not None:
                progress(f"  greedy on training episodes {list(config.eval_episodes)}: "
                         f"effectiveness {score['effectiveness']:.3f}")
            if best is None or score["effectiveness"] > best[0]:
                best = (score["effectiveness"], network)
            if e + 1 < config.episodes:  # an interrupted run still leaves its best so far
                _finish(config, meta, best, history, evaluations, started, complete=False)
    assert best is not None
    return _finish(config, meta, best, history, evaluations, started, complete=True)


def _finish(config: TrainConfig, meta: dict[str, Any],
            best: tuple[float, QNetwork | ScorerNetwork],
            history: list[dict[str, Any]], evaluations: list[dict[str, Any]], started: float,
            complete: bool) -> TrainResult:
    opts = config.options
    seconds = time.monotonic() - started
    chosen = next(ev for ev in evaluations if ev["effectiveness"] == best[0])
    record = {
        "complete": complete,
        "episodes_done": len(history),
        "command": config.command,
        "seconds": seconds,
        "episodes": config.episodes,
        "seed": config.seed,
        "workload": asdict(opts),
        "window": config.window,
        "profiles": config.profiles,
        "time_scale": config.time_scale,
        "dqn": asdict(config.dqn),
        "packing": config.packing,
        "canonical": config.canonical,
        "imitate_episodes": config.imitate_episodes,
        "pretrain_steps": config.pretrain_steps,
        "hold_rule_on_eval_episodes": meta.get("hold_rule_on_eval_episodes"),
        "eval_episodes": list(config.eval_episodes),
        "agent": config.agent,
        "loads": list(config.loads),
        "eval_loads": list(config.eval_loads or config.loads[:1]),
        "stored_candidates": config.stored_candidates,
        "chosen": chosen,
        "history": history,
        "evaluations": evaluations,
        "torch": torch.__version__,
    }
    # ``episodes`` is the run asked for; a file written before its end (every evaluation
    # leaves one) says how far it got.
    network = replace(best[1], meta={**meta, "chosen_after_episodes": chosen["episode"],
                                     "episodes_done": len(history), "complete": complete,
                                     "train_seconds": round(seconds, 1)})
    written = write_outputs(config.out, network, record)
    return TrainResult(network, record, written)


def write_outputs(out: Path, network: QNetwork | ScorerNetwork,
                  record: dict[str, Any]) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    network.save(out)
    written = [out]
    path = out.with_suffix(".json")
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    written.append(path)
    png = plot_curve(record, out.with_suffix(".png"))
    if png is not None:
        written.append(png)
    return written


def plot_curve(record: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("training_curve_skipped reason=matplotlib_not_installed")
        return None
    history, evaluations = record["history"], record["evaluations"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [h["episode"] + 1 for h in history]
    ax.plot(xs, [h["effectiveness"] for h in history], linewidth=0.8, alpha=0.6,
            label="training episode (ε-greedy)")
    ax.plot([ev["episode"] for ev in evaluations], [ev["effectiveness"] for ev in evaluations],
            marker="o", label=f"greedy, training episodes {record['eval_episodes']}"
            + (f" at loads {', '.join(f'{x:g}' for x in record['eval_loads'])}"
               if record.get("eval_loads") else ""))
    rule = record.get("hold_rule_on_eval_episodes")
    if rule:
        ax.axhline(rule["effectiveness"], color="black", linestyle="--", linewidth=1,
                   label="hold rule, same episodes")
    ax.set_xlabel("episode")
    ax.set_ylabel("mean execution effectiveness (Eq. 2)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{record.get('agent', 'sched2')} training, seed {record['seed']}, "
                 f"{record['seconds'] / 60:.0f} min")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def small_config(trace_dir: Path, out: Path, episodes: int, seed: int) -> TrainConfig:
    """A workload small enough to train on in seconds (tests): 4 servers, 100-job episodes,
    arrivals slowed by 15/4 so each GPU sees the load it sees on 15 servers."""
    options = replace(workload.Sched2Options(), servers=4, jobs=100, seed=seed,
                      mean_gap_s=172.0 * 15 / 4)
    return TrainConfig(trace_dir=trace_dir, out=out, episodes=episodes, seed=seed,
                       options=options, eval_every=max(1, episodes), eval_episodes=(0,),
                       dqn=replace(DqnConfig(), warmup=200, target_every=100),
                       decisions_per_episode=300)
