"""Each waiting job's candidate placements on the current platform (Algorithm 1, lines 2–13).

The platform ``P = <N, G>`` is taken per GPU model from the snapshot: N = registered nodes of
that model (down or drained ones included, so a node flapping does not reshuffle every job's
CER), G = the most GPUs such a node has. A job whose spec names no GPU model may use any model,
one at a time (a placement never mixes models).

Which shapes a job may take (``GenieSettings.shape_mode``):

- ``"cap"`` (default): GENIE chooses any ``<d_node, d_gpn>`` with ``d_node·d_gpn ≤ spec.gpus``;
  the user's GPU count is the most the job may get, the data-parallel global batch stays fixed.
- ``"exact"``: only ``d_node·d_gpn == spec.gpus``; GENIE chooses the topology only.
- ``"any"``: every ``<d_node, d_gpn>`` within the platform, whatever ``spec.gpus`` says
  (Algorithm 1 line 3 as the paper states it). For platforms whose jobs accept any shape
  (the global batch stays fixed, each GPU gets ``batch / (d_node·d_gpn)``); the requested
  count then only sizes a job that has no prediction model.

Always ``d_gpn ≤ G`` and ``d_node ≤ min(N, spec.max_nodes)``, and the model's guards apply
(see ``model``). A job with no usable prediction model — no batch/iterations in its spec, no
model type and nothing similar in the database, or no feasible shape under its model — is
"opaque": it takes exactly ``spec.gpus`` GPUs, runs at ``default_rate`` samples/s per GPU with
linear scaling, and its work is ``batch·iters`` or, if unknown, ``default_duration_s`` seconds
of one GPU. Its ECT (Eq. 9) follows from that.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie import model as perf
from masterd.core.genie.modeldb import ModelDB, Resolution
from masterd.core.genie.qos import DEFAULT_THETA, cer, cost, ect
from shared.model import Job, JobKind, JobSpec, QosClass

log = logging.getLogger("trellis.genie")

SHAPE_MODES = ("cap", "exact", "any")
URGENT_PLACEMENTS = ("fastest", "cer")
_TABLE_MEMO_LIMIT = 4096


@dataclass(frozen=True)
class GenieSettings:
    theta: float = DEFAULT_THETA
    shape_mode: str = "cap"
    default_rate: float = 100.0  # samples/s per GPU for jobs without a prediction model
    default_duration_s: float = 3600.0  # single-GPU seconds when a job's work is unknown
    # An Urgent job's ECT is 0 (Eq. 9): no placement can meet it, and Algorithm 1 line 13 would
    # give it the highest CER overall. The paper says such tasks "should be finished as soon
    # as possible", so by default they take the fastest placement; "cer" is the literal line 13.
    urgent_placement: str = "fastest"

    def __post_init__(self) -> None:
        for name in ("theta", "default_rate", "default_duration_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0 or (name != "theta" and value == 0):
                bound = ">= 0" if name == "theta" else "> 0"
                raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
        if self.urgent_placement not in URGENT_PLACEMENTS:
            raise ValueError(
                f"urgent_placement must be one of {', '.join(URGENT_PLACEMENTS)}, "
                f"got {self.urgent_placement!r}"
            )
        if self.shape_mode not in SHAPE_MODES:
            raise ValueError(
                f"shape_mode must be one of {', '.join(SHAPE_MODES)}, got {self.shape_mode!r}"
            )


@dataclass(frozen=True)
class GpuPlatform:
    """``P = <N, G>`` for one GPU model (Eq. 1)."""

    gpu_model: str
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class Platform:
    models: tuple[GpuPlatform, ...]  # sorted by GPU model name

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot) -> Platform:
        counts = {
            model: (sum(by_size.values()), max(by_size))
            for model, by_size in snapshot.node_sizes().items() if model is not None
        }
        return cls(tuple(GpuPlatform(m, n, g) for m, (n, g) in sorted(counts.items())))

    def for_spec(self, spec: JobSpec) -> tuple[GpuPlatform, ...]:
        if spec.gpu_model is None:
            return self.models
        return tuple(p for p in self.models if p.gpu_model == spec.gpu_model)


@dataclass(frozen=True)
class Candidate:
    """One placement shape of a job with its rate, cost and CER (Eq. 5, 10, 11)."""

    gpu_model: str
    d_node: int
    d_gpn: int
    rate: float
    cost: float
    cer: float
    group: int  # which of the job's per-GPU-model groups computes its latency
    # What candidates are ranked by: the CER itself when a job may use several GPU models;
    # with one model, CER = N·PR / (D/G + θ·d_node) and ranking by PR / (D/G + θ·d_node)
    # gives the same order without N's rounding, so it does not change as nodes join.
    score: float

    @property
    def gpus(self) -> int:
        return self.d_node * self.d_gpn


def rank_key(c: Candidate) -> tuple[float, float, str, int, int]:
    """Best first: highest CER (by ``score``); ties to the higher rate, then shape order."""
    return (-c.score, -c.rate, c.gpu_model, c.d_node, c.d_gpn)


def cer_score(
    rate: float, d_node: int, d_gpn: int, p: GpuPlatform, theta: float, several_models: bool
) -> tuple[float, float, float]:
    """(cost, CER, ranking score) of one shape: Eq. 10, Eq. 11 and ``Candidate.score``."""
    c = cost(d_node, d_gpn, p.nodes, p.gpus_per_node, theta)
    ratio = cer(rate, c)
    if several_models:
        return c, ratio, ratio
    return c, ratio, rate / ((d_node * d_gpn) / p.gpus_per_node + theta * d_node)


@dataclass(frozen=True)
class ShapeTable:
    """Candidates shared by every job with the same type, batch, limits and platform."""

    candidates: tuple[Candidate, ...]  # in rank_key order
    # Indices that may hold a latency record: within one group latency falls as the rate
    # rises, so only a rate record of its group can be a new latency minimum.
    record_hints: tuple[int, ...]
    fastest: int  # highest rate, ties by rank (-1 when there is no candidate)
    groups_with_candidates: frozenset[int]


@dataclass(frozen=True)
class Group:
    """How latency is computed on one GPU model: ``Lat = work / PR + nu`` (Eq. 4)."""

    gpu_model: str
    work: float
    nu: float
    resolution: Resolution | None  # None: opaque job on this model (default rate)


@dataclass(frozen=True)
class JobPlan:
    """A job's ECT and candidate placements, with the latency records SWAF selects from.

    ``records`` are the candidates, in rank order, whose latency is lower than every candidate
    ranked above them; ``record_latencies`` strictly decrease. The highest-CER placement that
    meets the ECT (Eq. 12) is always the first record fast enough, which makes selection a
    binary search. An ``asap`` plan (an Urgent job, see ``GenieSettings.urgent_placement``)
    always takes its last record: the fastest placement.
    """

    ect: float
    single_gpu_latency: float
    groups: tuple[Group, ...]
    table: ShapeTable
    records: tuple[int, ...]
    record_latencies: tuple[float, ...]
    _neg_latencies: tuple[float, ...] = field(repr=False)
    asap: bool = False

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return self.table.candidates

    def latency(self, index: int) -> float:
        c = self.table.candidates[index]
        g = self.groups[c.group]
        return perf.latency_from_rate(g.work, c.rate, g.nu)

    def state(self, now: float) -> int:
        """Which record is chosen at ``now``; ``len(records)`` means none meets the ECT.

        The state of an ``asap`` plan never changes: it is always ``len(records)``.
        """
        if self.asap:
            return len(self.records)
        return bisect.bisect_left(self._neg_latencies, -(self.ect - now))

    def pick(self, state: int) -> int:
        """The record taken in ``state``."""
        if state < len(self.records):
            return state
        # No placement meets the ECT: the highest CER overall (records[0]) per Algorithm 1
        # line 13, or the fastest (the last record) for an ``asap`` plan.
        return len(self.records) - 1 if self.asap else 0

    def choose(self, now: float) -> tuple[int, float] | None:
        """Algorithm 1, lines 8–13: (candidate index, latency) of the placement to take."""
        if not self.records:
            return None
        r = self.pick(self.state(now))
        return self.records[r], self.record_latencies[r]

    def latency_as_requested(self, gpus: int) -> float:
        """Predicted latency on exactly ``gpus`` GPUs (fewest nodes), for black-box baselines."""
        best: float | None = None
        for i, c in enumerate(self.table.candidates):
            if c.gpus == gpus:
                lat = self.latency(i)
                best = lat if best is None else min(best, lat)
        if best is not None:
            return best
        return self.single_gpu_latency / max(1, gpus)


def _shapes(spec: JobSpec, p: GpuPlatform, mode: str) -> Iterable[tuple[int, int]]:
    limit_nodes = min(p.nodes, spec.max_nodes or p.nodes)
    for d_gpn in range(1, p.gpus_per_node + 1):
        if mode == "exact":
            if spec.gpus % d_gpn == 0 and spec.gpus // d_gpn <= limit_nodes:
                yield spec.gpus // d_gpn, d_gpn
            continue
        most = limit_nodes if mode == "any" else min(limit_nodes, spec.gpus // d_gpn)
        for d_node in range(1, most + 1):
            yield d_node, d_gpn


def platform_view(
    spec: JobSpec, platform: Platform, shape_mode: str = "cap"
) -> tuple[object, ...]:
    """What of the platform a job's plan depends on; equal views give equal plans.

    Cost (Eq. 10) is ``(D/G + θ·d_node) / N``: within one GPU model, N scales every
    candidate's CER alike and cannot change their order, so N matters only through the
    largest usable ``d_node`` (at most ``spec.gpus`` — except under ``shape_mode="any"`` —
    and ``max_nodes``) — unless the job may use several GPU models, whose CERs N then weighs
    against each other. So a node joining a large cluster does not make the queue's jobs
    re-plan (under ``"any"`` it does, up to ``max_nodes``: every node is a usable shape).
    """
    models = platform.for_spec(spec)
    if spec.gpus == 0:
        return ()
    if shape_mode == "any":
        cap = spec.max_nodes or max((p.nodes for p in models), default=0)
    else:
        cap = min(spec.gpus, spec.max_nodes or spec.gpus)
    several = len(models) > 1
    return tuple(
        (p.gpu_model, min(p.nodes, cap), p.gpus_per_node, p.nodes if several else 0)
        for p in models
    )


class Estimator:
    """Builds job plans from the model database; memoises lookups and shape tables.

    A plan's ``Candidate.cost``/``cer`` use the platform's N at planning time; a policy that
    keeps a plan across platform changes with an equal ``platform_view`` (same ranking) should
    recompute them for display (``refresh_candidate``).
    """

    def __init__(self, db: ModelDB, settings: GenieSettings) -> None:
        self.db = db
        self.settings = settings
        self._tables: dict[tuple[object, ...], ShapeTable] = {}
        self._resolved: dict[tuple[object, ...], Resolution | None] = {}
        self._platform: Platform | None = None
        self._db_version = db.version

    def resolve(self, spec: JobSpec, gpu_model: str, kind: str) -> Resolution | None:
        key = (spec.model_type, gpu_model, kind, spec.model_family, spec.model_params_m)
        try:
            return self._resolved[key]
        except KeyError:
            res = self.db.resolve(
                spec.model_type, gpu_model, kind, spec.model_family, spec.model_params_m
            )
            if len(self._resolved) >= _TABLE_MEMO_LIMIT:
                self._resolved.clear()
            self._resolved[key] = res
            return res

    def plan(self, job: Job, platform: Platform) -> JobPlan:
        if self.db.version != self._db_version:
            self._resolved.clear()
            self._tables.clear()
            self._db_version = self.db.version
        if platform != self._platform:
            self._tables.clear()
            self._platform = platform
        spec = job.spec
        s = self.settings
        inference = spec.kind is JobKind.INFERENCE
        kind = "inference" if inference else "training"
        batch, iterations = spec.batch, spec.iterations
        work = float(batch * iterations) if batch is not None and iterations is not None else None
        opaque_work = work if work is not None else s.default_rate * s.default_duration_s

        # Per GPU model: the resolved prediction model, or None for the default rate.
        resolved: list[tuple[GpuPlatform, Resolution | None]] = []
        if spec.gpus > 0:
            for p in platform.for_spec(spec):
                res = None
                if work is not None:
                    res = self.resolve(spec, p.gpu_model, kind)
                resolved.append((p, res))
        table = self._table(spec, inference, resolved)
        if any(res is not None and g not in table.groups_with_candidates
               for g, (_, res) in enumerate(resolved)):
            # The model finds no feasible shape there (e.g. the batch never fits one GPU's
            # memory): treat the job as opaque on that GPU model rather than never running it.
            resolved = [
                (p, res if g in table.groups_with_candidates else None)
                for g, (p, res) in enumerate(resolved)
            ]
            table = self._table(spec, inference, resolved)

        groups: list[Group] = []
        baselines: list[float] = []
        for p, res in resolved:
            if res is not None and work is not None:
                if res.fallback:
                    log.debug("model_fallback job=%s gpu=%s reason=%r",
                              job.id, p.gpu_model, res.reason)
                groups.append(Group(p.gpu_model, work, res.coefficients.nu, res))
                nominal = perf.nominal_single_gpu_latency(res.coefficients, batch, iterations)
                if nominal is not None:
                    baselines.append(nominal)
            else:
                groups.append(Group(p.gpu_model, opaque_work, 0.0, None))
                baselines.append(opaque_work / s.default_rate)

        records: list[int] = []
        record_latencies: list[float] = []
        for i in table.record_hints:
            c = table.candidates[i]
            g = groups[c.group]
            lat = perf.latency_from_rate(g.work, c.rate, g.nu)
            if not record_latencies or lat < record_latencies[-1]:
                records.append(i)
                record_latencies.append(lat)
        if baselines:
            single = min(baselines)
        elif record_latencies:
            single = record_latencies[-1]
        else:
            single = opaque_work / s.default_rate
        expected = ect(spec.qos, job.submit_time, single, spec.deadline)
        return JobPlan(
            ect=expected,
            single_gpu_latency=single,
            groups=tuple(groups),
            table=table,
            records=tuple(records),
            record_latencies=tuple(record_latencies),
            _neg_latencies=tuple(-lat for lat in record_latencies),
            asap=(
                s.urgent_placement == "fastest"
                and spec.qos is QosClass.URGENT
                and spec.deadline is None
            ),
        )

    def _table(
        self,
        spec: JobSpec,
        inference: bool,
        resolved: Sequence[tuple[GpuPlatform, Resolution | None]],
    ) -> ShapeTable:
        sources = tuple(
            (p, res.coefficients if res is not None else None) for p, res in resolved
        )
        modelled = any(c is not None for _, c in sources)
        key = (sources, inference, spec.batch if modelled else None, spec.gpus, spec.max_nodes)
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= _TABLE_MEMO_LIMIT:
                self._tables.clear()
            table = build_table(spec, inference, sources, self.settings)
            self._tables[key] = table
        return table


def refresh_candidate(c: Candidate, platform: Platform, theta: float) -> Candidate:
    """``c`` with cost and CER recomputed for the current platform's N and G."""
    for p in platform.models:
        if p.gpu_model == c.gpu_model:
            fresh = cost(c.d_node, c.d_gpn, p.nodes, p.gpus_per_node, theta)
            return replace(c, cost=fresh, cer=cer(c.rate, fresh))
    return c


def build_table(
    spec: JobSpec,
    inference: bool,
    sources: Sequence[tuple[GpuPlatform, perf.Coefficients | None]],
    settings: GenieSettings,
) -> ShapeTable:
    candidates: list[Candidate] = []
    # Modelled groups exist only for jobs with a batch; 0 would make every shape infeasible.
    batch = float(spec.batch) if spec.batch is not None else 0.0
    several = len(sources) > 1
    for group, (p, coefficients) in enumerate(sources):
        if coefficients is None:
            shapes: Iterable[tuple[int, int]] = _shapes(spec, p, "exact")
        else:
            shapes = _shapes(spec, p, settings.shape_mode)
        for d_node, d_gpn in shapes:
            if coefficients is None:
                rate: float | None = d_node * d_gpn * settings.default_rate
            else:
                rate = perf.processing_rate(coefficients, batch, d_node, d_gpn, inference)
            if rate is None:
                continue
            c, ratio, score = cer_score(rate, d_node, d_gpn, p, settings.theta, several)
            candidates.append(Candidate(p.gpu_model, d_node, d_gpn, rate, c, ratio, group, score))
    candidates.sort(key=rank_key)
    best_rate: dict[int, float] = {}
    hints: list[int] = []
    fastest = -1
    for i, c in enumerate(candidates):
        if c.rate > best_rate.get(c.group, 0.0):
            best_rate[c.group] = c.rate
            hints.append(i)
        if fastest < 0 or c.rate > candidates[fastest].rate:
            fastest = i
    return ShapeTable(
        tuple(candidates), tuple(hints), fastest, frozenset(c.group for c in candidates)
    )


class PlanCache:
    """Plans of the queued jobs, kept across passes until a job leaves or its view of the
    platform (``platform_view``) or the model database changes."""

    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator
        self._db_version = estimator.db.version
        self._plans: dict[str, tuple[Job, tuple[object, ...], JobPlan]] = {}

    def plans(self, snapshot: ClusterSnapshot, queue: Sequence[Job]) -> dict[str, JobPlan]:
        platform = Platform.from_snapshot(snapshot)
        if self.estimator.db.version != self._db_version:
            self._plans.clear()
            self._db_version = self.estimator.db.version
        fresh: dict[str, tuple[Job, tuple[object, ...], JobPlan]] = {}
        for job in queue:
            known = self._plans.get(job.id)
            view = platform_view(job.spec, platform, self.estimator.settings.shape_mode)
            if known is None or known[0] is not job or known[1] != view:
                known = (job, view, self.estimator.plan(job, platform))
            fresh[job.id] = known
        self._plans = fresh
        return {job_id: known[2] for job_id, known in fresh.items()}
