"""Partitions (shared/partitions.py) in the master: where a job may run, and its limits.

* Every node's inventory carries the partitions the configuration puts it in
  (``events.effective_inventory``), so the one eligibility test every placer asks
  (masterd/core/eligibility.py) keeps a job on its partitions' nodes under every policy.
* At submission a job naming partitions keeps those that admit it (its account, its time
  limit); one naming none gets the default partition (unless it is in a reservation: it runs
  where the reservation is); a job without a time limit gets its partitions' default. A job
  no named partition admits, or that no node of its partitions could ever hold, is refused
  with one sentence (``invalid_partition``, ``unsatisfiable``).
* SIGHUP re-reads ``[[master.partitions]]``: nodes are re-labelled and a pass runs. A
  partition removed while queued jobs name only it stays until they are gone (logged), so a
  reload never strands a job.
* A partition's state (Slurm's up, down, drain, inactive), configured or set by an admin at
  run time (``trellisctl partition update``, journalled, kept across restarts and reloads):
  nodes are stamped with their partitions that start no job (down, inactive), so nothing
  starts through one down; one drained or inactive takes no new job (one sentence at
  submission).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from masterd.core.scheduler import JobError
from masterd.journal.partitions import load_states, save_state
from masterd.runtime.caller import caller
from masterd.runtime.context import FeatureContext
from shared.accounts import AccountTree
from shared.model import JobSpec, JobState, NodeInventory
from shared.partitions import STATES, Partition, PartitionError, PartitionTable

log = logging.getLogger("trellis.master.partitions")


class Partitions:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        # States an admin set at run time (trellisctl partition update): (state, reason,
        # since) by partition; they win over the configuration's.
        self.states: dict[str, tuple[str, str, float]] = {}
        self.table = PartitionTable.of(ctx.config().partitions)
        ctx.jobs.set_partition_tiers(self.table.tiers())
        self.tree = AccountTree.of(())
        events = ctx.events
        events.effective_inventory.provide(self.labelled)
        events.submitting.subscribe(self.check)
        # Before the time limit feature's and the accounts' defaults: a partition's default
        # time is the one Slurm writes into the job.
        events.spec_defaults.provide(self.with_partitions)
        events.accounts_changed.subscribe(self.accounts_changed)
        events.config_changed.subscribe(self.reconfigured)
        events.restored.subscribe(self.restored)

    # -- nodes ---------------------------------------------------------------------------
    def labelled(self, inventory: NodeInventory) -> NodeInventory:
        """The inventory with the partitions the configuration puts the node in."""
        partitions = self.table.of_node(inventory.name)
        closed = self.table.closed_on(inventory.name)
        if inventory.partitions == partitions and inventory.closed_partitions == closed:
            return inventory
        return replace(inventory, partitions=partitions, closed_partitions=closed)

    def restored(self) -> None:
        self.states = self.ctx.journal.now(load_states)
        if self.states:
            self._apply(self.table)
            log.info("partition states set by admins: %s", ", ".join(
                f"{name}={state}" for name, (state, _, _) in self.states.items()))
        self._warn_unknown_nodes()

    def _apply(self, table: PartitionTable) -> None:
        """Put ``table``, with the states admins set, in force: re-stamp every node."""
        states = {name: state for name, (state, _, _) in self.states.items()}
        table = table.with_states(states)
        if table == self.table:
            return
        self.table = table
        self.ctx.jobs.set_partition_tiers(table.tiers())
        for view in list(self.ctx.core.nodes()):
            self.ctx.nodes.reinventory(view.inventory.name)
        self.ctx.request_pass()

    async def set_state(self, name: str, state: str, reason: str) -> Partition:
        """An admin's ``trellisctl partition update NAME --state``: journalled, in force at
        once (a partition down or inactive starts nothing; drain or inactive takes no new
        job), kept across restarts and reloads."""
        if name not in self.table.partitions:
            raise JobError("invalid_partition", f"no partition {name!r} (partitions: "
                           f"{', '.join(self.table.partitions) or 'none'})")
        if state not in STATES:
            raise JobError("invalid_partition", f"partition state {state!r}: one of "
                           f"{', '.join(STATES)}")
        who = caller()
        now = self.ctx.clock()
        await self.ctx.journal.call(save_state, name, state, reason, now, (
            now, None, None, "partition_state", {"name": name, "state": state,
                                                 "reason": reason,
                                                 "who": "local" if who is None else who.name}))
        self.states[name] = (state, reason, now)
        log.info("partition=%s state=%s reason=%r", name, state, reason)
        self._apply(self.table)
        return self.table[name]

    def _warn_unknown_nodes(self) -> None:
        known = [v.inventory.name for v in self.ctx.core.nodes()]
        if not known:
            return  # a fresh master: no node has said hello yet
        for name, missing in self.table.unknown_nodes(known).items():
            log.warning("partition=%s names node(s) the master has never seen: %s", name,
                        ",".join(missing[:20]) + (" ..." if len(missing) > 20 else ""))

    # -- submissions ---------------------------------------------------------------------
    def accounts_changed(self, tree: AccountTree) -> None:
        self.tree = tree

    def _account(self, spec: JobSpec) -> str | None:
        """The account the job will run under (None: it cannot; the accounts feature says
        why)."""
        return self.tree.submission_account(spec.user, spec.tenant)

    def _placed(self, spec: JobSpec) -> JobSpec:
        """The spec in the partitions that admit it, with their default time limit."""
        try:
            choice = self.table.choose(spec.selector.partitions, self._account(spec),
                                       spec.time_limit_s)
        except PartitionError as exc:
            raise JobError("invalid_partition", f"job {spec.name}: {exc}") from None
        changes: dict[str, Any] = {}
        if choice.partitions != spec.selector.partitions:
            changes["selector"] = replace(spec.selector, partitions=choice.partitions)
        if choice.time_limit_s != spec.time_limit_s:
            changes["time_limit_s"] = choice.time_limit_s
        return replace(spec, **changes) if changes else spec

    def check(self, spec: JobSpec) -> None:
        """Refuse a job no partition it names admits, or that none of their nodes could
        ever hold."""
        if not self.table.enabled:
            if spec.selector.partitions:
                raise JobError("invalid_partition", f"job {spec.name}: this cluster has no "
                               "partitions; submit without --partition")
            return
        if _in_reservation(spec):
            return
        placed = self._placed(spec)
        reason = self.ctx.core.unsatisfiable(placed)
        if reason is not None:
            raise JobError("unsatisfiable", f"job {spec.name}: {reason}")

    def with_partitions(self, spec: JobSpec) -> JobSpec:
        if not self.table.enabled or _in_reservation(spec):
            return spec
        return self._placed(spec)  # checked at submission: refuses nothing here

    # -- configuration -------------------------------------------------------------------
    def reconfigured(self) -> None:
        configured = list(self.ctx.config().partitions)
        names = {p.name for p in configured}
        kept: list[Partition] = []
        for name, partition in self.table.partitions.items():
            if name in names:
                continue
            # Every queued job, those a gate holds back (held, waiting on another) too.
            waiting = [j.id for j in self.ctx.core.jobs.values()
                       if j.state is JobState.QUEUED and name in j.spec.selector.partitions
                       and not names.intersection(j.spec.selector.partitions)]
            if waiting:
                log.warning("partition=%s removed from the configuration but queued jobs "
                            "may run only there (%s): kept until they start or are "
                            "cancelled or updated", name, ",".join(waiting[:10]))
                kept.append(replace(partition, default=False))
        try:
            table = PartitionTable.of(configured + kept)
        except PartitionError as exc:  # the configuration was validated: only `kept` can
            log.error("partitions not reconfigured: %s", exc)
            return
        before = self.table
        self._apply(table)
        if self.table == before:
            return
        self._warn_unknown_nodes()
        log.info("partitions reconfigured: %s", ", ".join(table.partitions) or "none")

    # -- the view ------------------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        """Each partition with its nodes, GPUs and jobs now (``trellisctl partitions``)."""
        rows: dict[str, dict[str, Any]] = {}
        for p in self.table.partitions.values():
            state = self.states.get(p.name)
            rows[p.name] = {
                "name": p.name, "default": p.default, "nodes": p.nodes, "state": p.state,
                "priority_tier": p.priority_tier,
                "state_reason": state[1] if state is not None else "",
                "max_time_s": p.max_time_s, "default_time_s": p.time_for_unlimited,
                "allow_accounts": list(p.allow_accounts),
                "deny_accounts": list(p.deny_accounts),
                "node_count": 0, "schedulable": 0, "gpus": 0, "free_gpus": 0,
                "queued": 0, "running": 0,
            }
        for view in self.ctx.core.nodes():
            inventory = view.inventory
            open_ = view.schedulable
            free = len(view.free_gpus) if open_ else 0  # healthy and not held already
            for name in inventory.partitions:
                row = rows.get(name)
                if row is None:
                    continue
                row["node_count"] += 1
                row["schedulable"] += open_
                row["gpus"] += len(inventory.gpus)
                row["free_gpus"] += free
        for job in self.ctx.core.jobs.values():
            if job.state is not JobState.QUEUED:
                continue
            for name in job.spec.selector.partitions:
                if name in rows:
                    rows[name]["queued"] += 1
        for job in self.ctx.core.active_jobs().values():
            for name in job.spec.selector.partitions:
                if name in rows:
                    rows[name]["running"] += 1
        return list(rows.values())


def _in_reservation(spec: JobSpec) -> bool:
    """A job in a reservation that names no partition runs where the reservation is, under
    its rules (an admin made it for these users): no default partition is written into it,
    which would keep it off a reservation made on another partition's nodes."""
    return bool(spec.selector.reservation) and not spec.selector.partitions
