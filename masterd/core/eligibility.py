"""May this request use this node: the one answer every placer asks for.

A job that asks for no GPU may use any node's cores; one that asks for GPUs without naming a
model may use any node's; one that names a model only nodes of that model. A job's selector
(``JobSpec.selector``) narrows that further: nodes with every feature it names (Slurm's
``--constraint a&b``), with any of them (``a|b``), among those it lists (``--nodelist``), none
it excludes (``--exclude``), in one of
its partitions (``--partition``, shared/partitions.py), only where its time limit ends
before the node's next maintenance window (shared/maintenance.py) and before every
reservation of others there begins, and in its own reservation (``--reservation``,
shared/reservations.py) only on that reservation's nodes once it has begun. The
placers (packing, EASY backfill's shadow, quota reclaim, the profiler, Liquid's
candidates, SWAF's and SCHED²'s searches, the inference planner) all ask here, and the
scheduling core checks every start a policy decides against it, so a new condition (a
flavor) is added once.

:func:`placement_key` is the one key of a placement cache: the fields a placement depends
on, so no cache can hand one job's placement to a job that may not use its nodes.
"""

from __future__ import annotations

from shared.model import NO_SELECTOR, JobSpec, NodeInventory, NodeSelector, ReservationHold


def model_fits(wanted: str | None, model: str | None) -> bool:
    """A node whose GPUs are ``model`` serves a request for ``wanted`` (None: any model)."""
    return wanted is None or model == wanted


def eligible(spec: JobSpec, node: NodeInventory, *, now: bool = True,
             after: float = 0.0) -> bool:
    """The job may run on this node (``now`` False: at some time, windows aside: whether
    it could ever run there). ``after``: started that many seconds from now (EASY
    backfill's promise to its head job), judged as if every block ahead on the node (a
    window, a reservation) lasted for ever once begun: the stamps carry no end, so a
    promise is never made that a block would break."""
    if spec.gpus and spec.gpu_model is not None and node.gpu_model != spec.gpu_model:
        return False
    if now and node.maintenance_in_s is not None and (
            spec.time_limit_s is None
            or spec.time_limit_s + after > node.maintenance_in_s):
        return False  # it could still run when the node's maintenance window begins
    selector = spec.selector
    if node.reservations and not _reservations_allow(spec, selector.reservation,
                                                     node.reservations, now, after):
        return False
    if selector is NO_SELECTOR:
        return True
    if selector.reservation and not selector.flex and not any(
            h.name == selector.reservation for h in node.reservations):
        return False  # a job in a reservation runs on its nodes only
    if selector.features and not node.feature_set.issuperset(selector.features):
        return False
    if selector.any_features and node.feature_set.isdisjoint(selector.any_features):
        return False
    if selector.partitions and (
            node.open_partition_set if now else node.partition_set).isdisjoint(
                selector.partitions):
        return False  # (a partition down or inactive starts nothing, but will again)
    if selector.only and node.name not in selector.only:
        return False
    return node.name not in selector.exclude


def _reservations_allow(spec: JobSpec, mine: str, held: tuple[ReservationHold, ...],
                        now: bool, after: float = 0.0) -> bool:
    """The reservations holding a node let this job start there (``after`` seconds from
    now): its own once it has begun (a flex job's at any time), any other only if the job
    ends before it begins."""
    for hold in held:
        if hold.name == mine:
            if now and hold.in_s > after and not spec.selector.flex:
                return False  # its reservation has not begun
            continue
        if not now:
            continue  # some day it is over
        if spec.time_limit_s is None or spec.time_limit_s + after > hold.in_s:
            return False  # it could still run when another's reservation begins
    return True


def selects(spec: JobSpec) -> bool:
    """The job restricts its nodes beyond their GPU model (a search over a model's nodes
    must then ask :func:`eligible` of each)."""
    selector = spec.selector
    return selector is not NO_SELECTOR and selector != NO_SELECTOR


EligibilityKey = tuple[bool, "str | None", "float | None", NodeSelector]


def eligibility_key(spec: JobSpec, timed: bool) -> EligibilityKey:
    """What :func:`eligible` reads of a job (its time limit only where some node has a
    window or a reservation ahead, ``timed``): two jobs with one key may use the same nodes."""
    return (spec.gpus > 0, spec.gpu_model, spec.time_limit_s if timed else None, spec.selector)


PlacementKey = tuple[int, "str | None", int, int, "int | None", NodeSelector]


def placement_key(spec: JobSpec) -> PlacementKey:
    """What a placement of ``spec`` depends on: two specs with one key place alike."""
    return (spec.gpus, spec.gpu_model, spec.cpus, spec.memory_mib, spec.max_nodes,
            spec.selector)


def missing_features(spec: JobSpec, nodes: list[NodeInventory]) -> str:
    """The features the job needs (all of ``features``; ``any_features`` as a whole) that no
    node of ``nodes`` has, as a sentence part, or "" (each is somewhere, just not together)."""
    have: set[str] = set()
    for node in nodes:
        have.update(node.features)
    selector = spec.selector
    absent = [f for f in selector.features if f not in have]
    if selector.any_features and have.isdisjoint(selector.any_features):
        absent.append("|".join(selector.any_features))
    return ", ".join(absent)
