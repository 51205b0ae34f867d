"""SCHED²'s evaluation metrics of one replay (seeds/sched2.md §IV-B, §IV-C).

- **JCT**: mean completion − submission of the finished jobs;
- **makespan**: first submission to last completion;
- **execution effectiveness** (Eq. 2): mean over jobs of T_ideal / (T_wait + T_actual) with
  the truth's times: T_ideal the job's recorded duration (its run at best locality, alone),
  T_wait + T_actual its JCT. A job left unfinished counts 0;
- **fragmentation** (Eq. 1): the simulator's samples, mean over servers and time;
- **good locality**: share of the finished multi-GPU jobs placed on the fewest servers their
  GPU count allows (``ceil(GPUs / M)``), the paper's "best locality";
- mean wait and mean run time (the paper's Fig. 10).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from masterd.core.sched2.packing import best_servers
from sim.engine import SimResult
from sim.workloads.base import Workload


@dataclass(frozen=True)
class EpisodeMetrics:
    jobs: int
    unfinished: int
    jct_s: float
    makespan_s: float
    effectiveness: float
    fragmentation: float
    good_locality: float | None  # None: no multi-GPU job finished
    wait_s: float
    run_s: float

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def episode_metrics(workload: Workload, result: SimResult,
                    gpus_per_server: int) -> EpisodeMetrics:
    ideal = {j.id: j.truth.known_duration for j in workload.jobs}
    done = [r for r in result.records if r.state == "finished" and r.end is not None]
    jcts = [r.end - r.submit for r in done]  # type: ignore[operator]
    scores = []
    for r in result.records:
        t = ideal.get(r.id)
        if r.state == "finished" and r.end is not None and t is not None:
            scores.append(min(1.0, t / max(r.end - r.submit, 1e-9)))
        else:
            scores.append(0.0)
    multi = [r for r in done if r.gpus > 1]
    good = [r for r in multi if r.nodes_used <= best_servers(r.gpus, gpus_per_server)]
    first = min((r.submit for r in result.records), default=0.0)
    last = max((r.end for r in done if r.end is not None), default=first)
    frag = [s.fragmentation for s in result.samples]
    return EpisodeMetrics(
        jobs=len(result.records),
        unfinished=len(result.records) - len(done),
        jct_s=_mean(jcts),
        makespan_s=last - first,
        effectiveness=_mean(scores),
        fragmentation=_mean(frag),
        good_locality=len(good) / len(multi) if multi else None,
        wait_s=_mean([(r.first_start or r.submit) - r.submit for r in done]),
        run_s=_mean([r.run_time for r in done]),
    )


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan
