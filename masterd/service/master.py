"""The master: drives the scheduling core from real events and carries out its decisions.

Its features (``masterd.features``) are built by :mod:`masterd.service.features` around a
:class:`~masterd.runtime.context.FeatureContext` and hear from the master only through its
events (:class:`~masterd.runtime.events.MasterEvents`): the master names none of them.
"""

from __future__ import annotations

import asyncio
import logging
import pwd
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from masterd.core.conditions import DRAINED, MAINTENANCE, POWER
from masterd.core.fencing import Judgement, judge_part
from masterd.core.policies import make_policy
from masterd.core.policy import PREEMPTED_PREFIX, Preempt, Start
from masterd.core.scheduler import JobError, SchedulingCore, Transition
from masterd.core.timelimits import grace_for
from masterd.journal.drains import load_drains, save_drain
from masterd.journal.epochs import take_next_epoch
from masterd.journal.helios import load_power, save_power
from masterd.journal.journal import Journal
from masterd.journal.store import Store, StoreError
from masterd.journal.writer import set_log_level
from masterd.runtime.context import (
    CoreView,
    FeatureContext,
    JobActions,
    JournalPort,
    NodeCommands,
    Workers,
)
from masterd.runtime.events import MasterEvents
from masterd.runtime.tasks import TaskSupervisor
from masterd.service.bulk import BatchRefused, Refusal, journalled_ids
from masterd.service.features import Features, assemble
from masterd.service.jobmetrics import JobMetrics
from masterd.service.leader import Leadership
from masterd.service.sessions import CommandFailed, NodeSession
from shared.config import MasterConfig
from shared.messages import (
    Contention,
    ForgetJob,
    GpuHealth,
    GpuUtil,
    Hello,
    HelloAck,
    JobExited,
    JobMetric,
    JobReport,
    JobStarted,
    ListParts,
    PartList,
    PrepareJob,
    StartJob,
    StopJob,
)
from shared.model import (
    Job,
    JobSpec,
    JobState,
    NodeAllocation,
    NodeInventory,
    Placement,
    check_name,
)
from shared.protocol import ProtocolError
from shared.schema import SchemaError, decode, encode

_ROUTINE = frozenset({JobState.RUNNING, JobState.FINISHED})

log = logging.getLogger("trellis.master")

# Node refusals that no retry can cure: the job fails instead of being re-queued forever.
PERMANENT_REFUSALS = frozenset({"user_refused", "unknown_user"})
POWER_STATES = ("powering_down", "powered_down", "powering_up")
# A start_job expires on its node after this share of command_timeout_s (StartJob.expires_at).
START_DEADLINE_SHARE = 0.8


def prepare_wire(message: PrepareJob, spec: dict[str, Any]) -> dict[str, Any]:
    """``message`` in wire form with its spec given already encoded (the spec is most of
    the message, and the same on every node and every retry)."""
    return {f.name: spec if f.name == "spec" else encode(getattr(message, f.name))
            for f in fields(message)}


def _power_sentence(state: str, reason: str) -> str:
    """A power state as a node condition's reason ("powered_off: idle for 30 min")."""
    return f"{state}: {reason}" if reason else state


def _exit_of(report: JobReport) -> JobExited:
    """An exited part, as a node's hello reports it, as the event of its exit."""
    return JobExited(report.job_id, report.exit_code, report.signal, reason=report.reason,
                     restarts=report.restarts, fenced=report.fenced)


class UserCache:
    """Remembers which Unix users exist for a short while: a getpwnam per submission reads the
    user database (or asks LDAP) and costs more than the journal write."""

    def __init__(self, clock: Callable[[], float], ttl_s: float = 30.0) -> None:
        self.clock = clock
        self.ttl_s = ttl_s
        self._seen: dict[str, tuple[bool, float]] = {}

    def exists(self, user: str) -> bool:
        now = self.clock()
        hit = self._seen.get(user)
        if hit is not None and now - hit[1] < self.ttl_s:
            return hit[0]
        try:
            pwd.getpwnam(user)
            found = True
        except KeyError:
            found = False
        if len(self._seen) > 10_000:
            self._seen.clear()
        self._seen[user] = (found, now)
        return found


class Master:
    def __init__(self, config: MasterConfig, clock: Callable[[], float] = time.time,
                 store: Store | None = None) -> None:
        """``store``: the journal to use (the PostgreSQL one an elected master opened, see
        masterd.main); by default the SQLite file in ``state_dir``."""
        self.config = config
        self.clock = clock
        self.core = SchedulingCore(make_policy(config.policy, **config.policy_options),
                                   max_start_failures=config.max_start_failures)
        self.store = store if store is not None else Store(Path(config.state_dir) / "master.db")
        # Leader election (masterd.service.leader); on SQLite this master always leads.
        self.leadership = Leadership()
        # Set when the leadership is lost: nothing is scheduled or sent to nodes any more.
        self.halted = False
        self.journal = Journal(self.store)
        self.sessions: dict[str, NodeSession] = {}
        # Cluster Energy Saving: node -> (power state, since, reason); journalled. Whether a
        # node takes new work is the core's (its node conditions), never recomputed here.
        self.power: dict[str, tuple[str, float, str]] = {}
        self.unreachable: set[str] = set()
        self.gpu_util: dict[str, dict[int, GpuUtil]] = {}
        self._seq = self.store.next_seq()
        self._pass_pending = False
        # The pass a policy asked for at a time of its own (SchedulingCore.wake_at).
        self._wake_handle: asyncio.TimerHandle | None = None
        self._wake_time = 0.0
        self._launching: set[str] = set()
        # The launch of each job whose start commands are in flight (a stop waits for it) ...
        self._launches: dict[str, asyncio.Future[Any]] = {}
        # ... and, for a start that went unanswered, when its node will refuse it (its
        # expires_at): a stop waits for that moment too.
        self._unsettled_starts: dict[str, float] = {}
        self.tasks = TaskSupervisor()
        self._grace: dict[str, asyncio.TimerHandle] = {}
        self.passes = 0
        # Ended jobs still in core.jobs, oldest-ended first: beyond
        # config.finished_jobs_in_memory the oldest are forgotten (see note_ended).
        self._ended: OrderedDict[str, None] = OrderedDict()
        # Set by masterd.api.metrics when metrics are served: (pass seconds, decisions) -> None.
        self.observe_pass: Callable[[float, list[Any]], None] | None = None
        self._users = UserCache(clock)
        # What jobs report on their metrics channel (for trellisctl show and the features).
        self.job_metrics = JobMetrics(clock)
        self.events = MasterEvents()
        self.context = FeatureContext(
            clock=clock,
            config=lambda: self.config,
            journal=JournalPort(self.journal, self.store),
            core=CoreView(self.core),
            request_pass=self.request_pass,
            jobs=JobActions(
                check_user=self.check_user, submit=self.submit, cancel=self.cancel,
                preempt=self.preempt, drop_queued=self.drop_queued,
                launch_placed=self.launch_placed, cores_changed=self.core.cores_changed,
                cancel_restored=self.cancel_restored, annotate=self.annotate,
                post_phase=self.post_phase, set_gate=self.core.set_gate, stop=self.stop,
                reorder=self.core.reorder, lose_parts=self.lose_parts,
                set_admission=self.core.set_admission,
                set_priority_classes=self.core.set_priority_classes,
                set_partition_tiers=self.core.set_partition_tiers),
            nodes=NodeCommands(send=self._command, status=self.node_status,
                               set_power=self.set_power, power_state=self.power_state,
                               gpu_health=self.set_gpu_health,
                               reinventory=self.reinventory,
                               set_condition=self.set_node_condition,
                               epoch=lambda: self.leadership.epoch, push=self._push),
            tasks=self.tasks,
            events=self.events,
            workers=Workers(),
        )
        # The features subscribe to self.events; the policy comes out with GENIE's live
        # model database in every predicting part of it, and the profiler's runs set apart.
        self.features: Features
        self.features, self.core.policy = assemble(self.context, config)

    # -- lifecycle -----------------------------------------------------------------------
    def restore(self) -> None:
        """Reload nodes and jobs from the journal (before serving)."""
        if self.store.epoch is None:
            # SQLite: each start is a new epoch (PostgreSQL's comes from the lease).
            self.leadership.epoch = take_next_epoch(self.store, self.clock())
            log.info("epoch=%d (this start of the master)", self.leadership.epoch)
        drains = load_drains(self.store)  # why each drained node is (since, reason)
        for inventory, drained, _ in self.store.load_nodes():
            self.core.node_up(self.events.effective_inventory(inventory))
            self.core.node_down(inventory.name)  # until it reconnects
            if drained:
                since, reason = drains.get(inventory.name, (None, ""))
                self.core.set_drained(inventory.name, True, reason, since)
        if self.config.power.enabled:  # Cluster Energy Saving's states (set_power)
            self.power = {node: (state, since, reason) for node, (state, since, reason)
                          in load_power(self.store).items()
                          if self.core.cluster.node(node) is not None}
            for node, (state, since, reason) in self.power.items():
                self.core.set_condition(node, POWER, _power_sentence(state, reason), since)
        # Every job still queued or placed, but only the newest ended ones: the journal holds
        # every job ever run, and loading them all made restarts and memory grow without end.
        jobs = self.store.restore_jobs(self.config.finished_jobs_in_memory)
        for job in jobs:
            self.core.restore(job)
        for job in jobs:
            if not job.state.terminal and job.state is not JobState.QUEUED:
                problem = self.core.claim_restored(job.id)
                if problem:
                    log.error("job=%s cannot re-claim its resources: %s", job.id, problem)
        # The features settle what they journalled (services, campaigns, array demand).
        self.events.restored.emit()
        active = sum(1 for j in jobs if not j.state.terminal and j.state is not JobState.QUEUED)
        log.info(
            "restored jobs=%d queued=%d active=%d nodes=%d",
            len(jobs), len(self.core.queue()), active, len(self.core.cluster.node_names),
        )
        # Oldest-ended first, as if they had ended in this run (a feature's restore above may
        # have cancelled some, so this comes after it).
        ended = sorted((j for j in self.core.jobs.values() if j.state.terminal),
                       key=lambda j: j.end_time if j.end_time is not None else j.submit_time)
        for job in ended:
            self.note_ended(job.id)

    def halt(self, reason: str) -> None:
        """Stop scheduling at once (the leadership was lost): no pass runs and no command
        reaches a node from now on; node sessions are closed so nodes find the new leader."""
        if self.halted:
            return
        self.halted = True
        log.error("scheduling stopped: %s", reason)
        for session in list(self.sessions.values()):
            session.close()
            self.tasks.spawn(session.ws.close(message=b"this master no longer leads"))

    async def close(self) -> None:
        for handle in self._grace.values():
            handle.cancel()
        if self._wake_handle is not None:
            self._wake_handle.cancel()
        await self.tasks.close()
        await self.context.workers.close()
        self.journal.close()

    def log_level_changed(self, level: str) -> None:
        """The daemon's log level changed (SIGHUP): the journal writer, a process of its
        own, follows."""
        self.tasks.spawn(self.journal.call(set_log_level, level))

    # -- submissions ---------------------------------------------------------------------
    def check_user(self, user: str) -> None:
        if user == "root" and not self.config.allow_root_jobs:
            raise JobError("user_refused", "jobs may not run as root")
        if self.config.allowed_users and user not in self.config.allowed_users:
            raise JobError("user_refused", f"user {user!r} is not on the allowed list")
        if not self._users.exists(user):
            raise JobError("unknown_user", f"Unix user {user!r} does not exist")

    def _check_new(self, spec: JobSpec, job_id: str | None) -> None:
        """Everything that may refuse one submission before it is journalled."""
        if self.halted:
            raise JobError("not_leader", "this master no longer leads; retry on the leader")
        if job_id is not None:  # a bad id is the first thing to report, whatever else is wrong
            check_name(job_id, "job id")
        self.check_user(spec.user)
        # The features first: a partition the job names that does not exist is the mistake
        # to report, not that no node is in it.
        self.events.submitting(spec)
        self.core.check_submittable(spec)

    def _reserve(self, spec: JobSpec, job_id: str | None,
                 wire_spec: dict[str, Any] | None) -> tuple[int, Job]:
        """A checked submission's sequence number and job, its id held in memory so that a
        concurrent duplicate is refused while the journal writes it."""
        seq = self._seq
        self._seq += 1
        completed = self.events.spec_defaults(spec)  # e.g. the default time limit
        if completed is not spec:
            spec, wire_spec = completed, None  # the client's map no longer decodes to it
        if job_id is None:
            job_id = f"{spec.name[:44]}-{seq}"
        if job_id in self.core.jobs:
            raise JobError("duplicate_job", f"job id {job_id!r} already exists")
        job = Job(id=job_id, spec=spec, submit_time=self.clock())
        if wire_spec is not None:
            self.journal.wire.remember_spec(job, wire_spec)
        self.core.jobs[job_id] = job
        return seq, job

    def _unreserve(self, job_id: str) -> None:
        del self.core.jobs[job_id]
        self.journal.wire.forget(job_id)

    @staticmethod
    def _not_stored(job_id: str, exc: BaseException) -> JobError:
        """Why the journal did not take a submission, as the client hears it."""
        if isinstance(exc, StoreError):
            return JobError("store_unavailable", str(exc))
        if isinstance(exc, sqlite3.IntegrityError):
            # The id belongs to a journalled job the master no longer keeps in memory (an
            # ended one beyond finished_jobs_in_memory, or one written before a crash).
            return JobError("duplicate_job", f"job id {job_id!r} already exists (an ended "
                            "job; trellisctl show lists it)")
        return JobError("duplicate_job", f"job id {job_id!r} cannot be stored: {exc}")

    def _accept(self, job: Job) -> None:
        """A journalled submission joins the queue (the caller requests the pass)."""
        del self.core.jobs[job.id]
        self.core.submit(job)
        self.events.job_submitted.emit(job)
        # Debug, not info: the journal's "submitted" event already records every submission
        # (trellisctl events), and a log line per submission costs a tenth of the request.
        log.debug("job=%s submitted tenant=%s gpus=%d cpus=%d", job.id, job.spec.tenant,
                  job.spec.gpus, job.spec.cpus)

    async def submit(self, spec: JobSpec, job_id: str | None = None,
                     wire_spec: dict[str, Any] | None = None) -> Job:
        """``wire_spec``: a map that decodes to ``spec`` (the one the client sent), kept as
        the spec's wire form instead of encoding the spec again."""
        await self.events.preparing((spec,), (job_id,))
        self._check_new(spec, job_id)
        for refusal in self.events.screening((spec,), (job_id,)).values():
            raise refusal
        seq, job = self._reserve(spec, job_id, wire_spec)
        self.events.reserved.emit((job,), (job_id is not None,))
        try:
            await self.journal.submit(seq, job)
        except Exception as exc:
            self._unreserve(job.id)
            raise self._not_stored(job.id, exc) from None
        self._accept(job)
        self.request_pass()
        return job

    def batch_refusals(self, specs: Sequence[JobSpec], ids: Sequence[str | None]
                       ) -> list[Refusal]:
        """Every job of a batch that ``submit`` would refuse, by index, with the reason; ids
        the batch repeats or the master holds in memory count as duplicates."""
        refusals: list[Refusal] = []
        seen: set[str] = set()
        for index, (spec, job_id) in enumerate(zip(specs, ids, strict=True)):
            try:
                self._check_new(spec, job_id)
                if job_id is not None and (job_id in seen or job_id in self.core.jobs):
                    raise JobError("duplicate_job", f"job id {job_id!r} already exists"
                                   + (" in this batch" if job_id in seen else ""))
            except JobError as exc:
                refusals.append(Refusal(index, exc.code, str(exc)))
            except ValueError as exc:  # a bad id (check_name)
                refusals.append(Refusal(index, "invalid_params", str(exc)))
            if job_id is not None:
                seen.add(job_id)
        # What depends on the batch as a whole (dependencies between its jobs, cycles).
        refused = {r.index for r in refusals}
        screened = [Refusal(index, exc.code, str(exc))
                    for index, exc in self.events.screening(specs, ids).items()
                    if index not in refused]
        return sorted(refusals + screened, key=lambda r: r.index) if screened else refusals

    async def submit_many(self, specs: Sequence[JobSpec],
                          ids: Sequence[str | None] | None = None,
                          wire_specs: Sequence[dict[str, Any] | None] | None = None
                          ) -> list[Job]:
        """Many jobs, all or none: each is checked as ``submit`` checks one, and any refusal
        refuses the batch (:class:`BatchRefused` names every refused job by index). The jobs
        are handed to the journal in one loop turn, so its group commit writes them in one
        transaction. Only a store failure part-way can leave part of a batch accepted: the
        error then lists which jobs were journalled (and queued) and which were not."""
        if self.halted:  # the batch as a whole: a client then retries it on the leader
            raise JobError("not_leader", "this master no longer leads; retry on the leader")
        ids = list(ids) if ids is not None else [None] * len(specs)
        wires = list(wire_specs) if wire_specs is not None else [None] * len(specs)
        await self.events.preparing(specs, ids)
        refusals = self.batch_refusals(specs, ids)
        if refusals:
            raise BatchRefused(refusals, len(specs))
        reserved = [self._reserve(spec, job_id, wire)
                    for spec, job_id, wire in zip(specs, ids, wires, strict=True)]
        self.events.reserved.emit([job for _, job in reserved], [i is not None for i in ids])
        chosen = [job_id for job_id in ids if job_id is not None]
        try:
            # Ended jobs the master forgot keep their ids in the journal: one look for all.
            taken = set(await self.journal.call(journalled_ids, chosen)) if chosen else set()
        except Exception:
            for _, job in reserved:
                self._unreserve(job.id)
            raise
        if taken:
            for _, job in reserved:
                self._unreserve(job.id)
            raise BatchRefused([Refusal(i, "duplicate_job", f"job id {job_id!r} already "
                                        "exists (an ended job; trellisctl show lists it)")
                                for i, job_id in enumerate(ids) if job_id in taken], len(specs))
        writes = [self.journal.submit(seq, job) for seq, job in reserved]
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        failed: list[Refusal] = []
        accepted: list[Job] = []
        for index, ((_, job), outcome) in enumerate(zip(reserved, outcomes, strict=True)):
            if isinstance(outcome, BaseException):
                self._unreserve(job.id)
                refusal = self._not_stored(job.id, outcome)
                failed.append(Refusal(index, refusal.code, str(refusal)))
            else:
                self._accept(job)
                accepted.append(job)
        if accepted:
            self.request_pass()
        if failed:
            raise BatchRefused(failed, len(specs), accepted=[job.id for job in accepted])
        return accepted

    async def find_job(self, job_id: str) -> Job | None:
        """The job in memory, else as the journal has it (an ended job the master forgot),
        else None. A journalled copy is a snapshot: changing it changes nothing."""
        job = self.core.jobs.get(job_id)
        if job is not None:
            return job
        return await self.journal.call(Store.load_job, job_id)

    # -- the bounded job table -----------------------------------------------------------
    def note_ended(self, job_id: str) -> None:
        """Count a job that reached a terminal state against finished_jobs_in_memory and
        forget the oldest-ended ones beyond it (their journal rows stay)."""
        self._ended[job_id] = None
        cap = self.config.finished_jobs_in_memory
        while len(self._ended) > cap:
            oldest, _ = self._ended.popitem(last=False)
            self._forget_ended(oldest)

    def _forget_ended(self, job_id: str) -> None:
        try:
            job = self.core.forget(job_id)
        except JobError as exc:  # never expected: only ended jobs are counted
            log.error("job=%s not forgotten: %s", job_id, exc)
            return
        # Everything else the master keeps per job goes with it.
        self.journal.wire.forget(job_id)
        self.job_metrics.forget(job_id)
        self.events.job_forgotten.emit(job)
        log.debug("job=%s forgotten state=%s (kept in the journal)", job_id, job.state.value)

    async def cancel(self, job_id: str) -> Job:
        return await self.stop(job_id, JobState.CANCELLED, "cancelled")

    async def stop(self, job_id: str, end_as: JobState, reason: str) -> Job:
        """End a job in ``end_as`` (see JobActions.stop)."""
        now = self.clock()
        transition, stop_on = self.core.stop(job_id, end_as, reason, now)
        job = self.core.jobs[job_id]
        if end_as is JobState.CANCELLED:
            requested = (now, job_id, None, "cancel_requested", {})
        else:
            requested = (now, job_id, None, "stop_requested",
                         {"end_as": end_as.value, "reason": reason})
        await self._persist([job], [requested])
        if transition is not None:
            await self._record(transition)
        for node in stop_on:
            self.tasks.spawn(self._stop_part(job_id, node, reason))
        launch = self._launches.get(job_id)
        if launch is not None:
            # A start may be on its way to a node: answer once the launch has settled (the
            # start answered, refused or expired on the node, StartJob.expires_at), so that
            # nothing of the job starts after the stop is acknowledged. At most the
            # command's timeout; the launch itself never sends a start after this point.
            # (A part that did start is stopped when its node reports it: _on_started.)
            await asyncio.wait({launch}, timeout=self.config.command_timeout_s + 1)
        unsettled = self._unsettled_starts.get(job_id)
        if unsettled is not None:
            # A start went unanswered: its node may still read it until its deadline (and
            # then refuses it); answer after that.
            wait = unsettled - self.clock()
            if wait > 0:
                await asyncio.sleep(min(wait, self.config.command_timeout_s))
            self._unsettled_starts.pop(job_id, None)
        return job

    async def lose_parts(self, job_id: str, lost: Sequence[str], reason: str,
                         end_as: JobState | None) -> Job:
        """Take a job off its nodes after a failure (see JobActions.lose_parts): its parts
        on ``lost`` nodes count as exited (those nodes cannot answer), its other parts are
        stopped, and once they exited the job is queued again (``end_as`` queued) or ends
        ``end_as`` (node_lost). ``end_as`` None, or a job being stopped already: its end
        stands, only the lost parts are counted. Journalled before any node is told."""
        now = self.clock()
        job = self.core.jobs.get(job_id)
        if job is None:
            raise JobError("unknown_job", f"job {job_id!r} does not exist")
        transition: Transition | None = None
        stop_on: list[str] = []
        events: list[tuple[Any, ...]] = []
        if end_as is not None and not job.stopping:
            if end_as is JobState.QUEUED:
                transition, stop_on = self.core.requeue(job_id, reason, now)
                kind = "requeue_requested"
            else:
                transition, stop_on = self.core.stop(job_id, end_as, reason, now)
                kind = "stop_requested"
            events.append((now, job_id, None, kind, {"end_as": end_as.value,
                                                     "reason": reason,
                                                     "restarts": job.restarts}))
        else:
            stop_on = [n for n, s in job.node_states.items() if s != "exited"]
        for node in lost:
            if job.node_states.get(node) in (None, "exited"):
                continue
            done, _ = self.core.node_exited(job_id, node, None, None, now)
            events.append((now, job_id, node, "part_lost", {"reason": reason}))
            transition = transition or done
        await self._persist([job], events)
        if transition is not None:
            await self._record(transition)
        for node in stop_on:
            if node not in lost:
                self.tasks.spawn(self._stop_part(job_id, node, reason))
        return job

    # -- scheduling ----------------------------------------------------------------------
    def request_pass(self) -> None:
        """Schedule one pass soon; a burst of events costs one pass, not one each."""
        if not self._pass_pending:
            self._pass_pending = True
            asyncio.get_running_loop().call_soon(self._run_pass)

    def _run_pass(self) -> None:
        self._pass_pending = False
        if self.halted:
            return
        # Inference first: resources an event freed go to the service that asked for them
        # (a preempted job re-queued at the head must not take them straight back).
        self.events.before_pass.emit()
        now = self.clock()
        started = time.perf_counter()
        decisions = self.core.schedule(now)
        elapsed = time.perf_counter() - started
        self.passes += 1
        if self.observe_pass is not None:
            self.observe_pass(elapsed, decisions)
        if self.core.wake_at is not None:
            self._wake(self.core.wake_at)
        for decision in decisions:
            if isinstance(decision, Start):
                job = self.core.jobs[decision.job_id]
                self._launching.add(job.id)
                self.tasks.spawn(self._launch(job))
            elif isinstance(decision, Preempt):
                self.tasks.spawn(self._preempt(decision))

    def _wake(self, when: float) -> None:
        """A pass at ``when`` although no event may come (a policy's batch window closes)."""
        handle = self._wake_handle
        if handle is not None and self._wake_time <= when:
            return
        if handle is not None:
            handle.cancel()
        self._wake_time = when
        self._wake_handle = asyncio.get_running_loop().call_later(
            max(0.0, when - self.clock()), self._woken)

    def _woken(self) -> None:
        self._wake_handle = None
        self.request_pass()

    async def _launch(self, job: Job) -> None:
        """Two-phase start: every node prepares (checks user, GPUs, creates its cgroup), then
        every node starts. A job spanning nodes runs on all of them or on none."""
        # A failed launch may requeue the job, and a pass launch it again, before this one
        # has returned: the markers below are then the newer launch's, not this one's.
        attempt = job.attempts
        try:
            placement = job.placement
            assert placement is not None
            now = self.clock()
            detail = {"placement": [
                {"node": a.node, "gpus": list(a.gpus), "cpus": list(a.cpus)}
                for a in placement.allocations
            ], "attempt": job.attempts, "restarts": job.restarts}
            await self._persist([job], [(now, job.id, None, "placed", detail)])
            nnodes = len(placement.allocations)
            spec = self.journal.wire.spec(job)  # encoded at submission, reused here
            # What a node cut off from every master needs to stop the part on its own before
            # the master requeues it elsewhere (the node lease, masterd.features.selffence).
            grace = grace_for(job.spec, self.config.stop_grace_s, self.config.max_grace_s)
            requeue_if_lost = self.events.requeue_if_lost(job)
            prepares = []
            for rank, a in enumerate(placement.allocations):
                cores = self.events.core_plan(job, a)
                # The core plan may have given the part more cores (SODA §V-B): send what it
                # holds now.
                a = self._allocation_on(job, a)
                prepares.append(self._command(a.node, "prepare_job", prepare_wire(PrepareJob(
                    job_id=job.id, spec=job.spec, allocation=a, node_rank=rank, nnodes=nnodes,
                    cores=cores, restarts=job.restarts,
                    grace_s=grace, requeue_if_lost=requeue_if_lost,
                    nodes=tuple(b.node for b in placement.allocations)), spec)))
            if job.placement != placement:  # widened: journalled before any node hears of it
                await self._persist([job], [])
            results = await asyncio.gather(*prepares, return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                # A node that refuses the job's user will refuse it on every retry.
                permanent = [f for f in failures if isinstance(f, CommandFailed)
                             and f.code in PERMANENT_REFUSALS]
                # A node holding GPUs the master thought free holds them for a part the
                # master does not own: once that is accounted for, the refusal is no
                # failure of the job's, and the next placement avoids those GPUs.
                busy = [a for a, r in zip(placement.allocations, results, strict=True)
                        if isinstance(r, CommandFailed) and r.code == "gpus_busy"]
                explained = bool(busy) and len(busy) == len(failures) and all(
                    [await self._holders_found(a.node, a.gpus) for a in busy])
                await self._abort_launch(job, str((permanent or failures)[0]),
                                         permanent=bool(permanent), counted=not explained)
                return
            if job.end_as or job.stopping:
                # Cancelled (or asked to end, or preempted) while the nodes prepared: never
                # start it. The failed launch ends it as asked, or queues the preempted job
                # again (SchedulingCore.start_failed).
                await self._abort_launch(job, f"{job.reason} during its launch")
                return
            rank0 = placement.allocations[0].node
            view = self.core.cluster.node(rank0)
            addr = view.inventory.address if view else "127.0.0.1"
            port = int(results[0].get("port", 29500))  # type: ignore[union-attr]
            # A start the node reads after this master stopped waiting for it is refused
            # there (a frozen node, a frame held in a buffer): a cancel acknowledged once the
            # launch has failed can then never be overtaken by it. The deadline comes before
            # the command's timeout here, by more than the nodes' clock offset errors.
            expires = self.clock() + START_DEADLINE_SHARE * self.config.command_timeout_s
            task = asyncio.current_task()
            if task is not None:
                self._launches[job.id] = task
            starts = [
                self._command(a.node, "start_job",
                              StartJob(job_id=job.id, master_addr=addr, master_port=port,
                                       restarts=job.restarts, expires_at=expires))
                for a in placement.allocations
            ]
            results = await asyncio.gather(*starts, return_exceptions=True)
            failed = {a.node: r for a, r in zip(placement.allocations, results, strict=True)
                      if isinstance(r, BaseException)}
            unknown = [node for node, r in failed.items()
                       if isinstance(r, CommandFailed) and r.unknown_outcome]
            if unknown:
                self._unsettled_starts[job.id] = expires
                await self._start_unknown(job, failed, unknown)
            elif failed:
                await self._abort_launch(job, str(next(iter(failed.values()))))
        finally:
            if job.attempts == attempt:
                self._launching.discard(job.id)
            if self._launches.get(job.id) is asyncio.current_task():
                del self._launches[job.id]

    async def _start_unknown(self, job: Job, failed: Mapping[str, BaseException],
                             unknown: Sequence[str]) -> None:
        """Some start went unanswered (a timeout, the connection lost): its part may run.
        The job is requeued as after a node loss, not as after a refused start: it keeps
        its resources until every part is known to have exited (its node reports it when it
        reconnects, or is declared lost and its lease has stopped it), so no second
        incarnation can run beside one that did start."""
        reason = f"start of its part on {', '.join(unknown)} unanswered: {failed[unknown[0]]}"
        log.warning("job=%s %s; requeued once its parts are known to have exited", job.id,
                    reason)
        now = self.clock()
        transition, live = self.core.requeue(job.id, reason, now)
        events: list[tuple[Any, ...]] = [(now, job.id, None, "requeue_requested", {
            "end_as": job.end_as or JobState.QUEUED.value, "reason": reason,
            "restarts": job.restarts})]
        for node in failed:
            if node not in unknown:  # refused: that part never started
                done, _ = self.core.node_exited(job.id, node, None, None, now)
                transition = transition or done
        await self._persist([job], events)
        if transition is not None:
            await self._record(transition)
        for node in live:
            if node not in failed or node in unknown:
                self.tasks.spawn(self._stop_part(job.id, node, reason))

    def _allocation_on(self, job: Job, alloc: NodeAllocation) -> NodeAllocation:
        """The job's allocation on ``alloc.node`` as the cluster holds it now."""
        held = self.core.placement_of(job.id)
        if held is None:
            return alloc
        return next((a for a in held.allocations if a.node == alloc.node), alloc)

    async def _abort_launch(self, job: Job, reason: str, permanent: bool = False,
                            counted: bool = True) -> None:
        log.warning("job=%s launch failed: %s%s", job.id, reason,
                    "" if counted else " (not counted: the node held them for a stray part)")
        placement = job.placement
        nodes = placement.nodes if placement else ()
        await asyncio.gather(
            *(self._stop_part(job.id, n, "launch aborted", record=False) for n in nodes),
            return_exceptions=True,
        )
        transition = self.core.start_failed(job.id, reason, self.clock(), counted=counted)
        if transition and permanent and transition.state in (JobState.QUEUED,
                                                               JobState.FAILED):
            # (A job cancelled meanwhile stays cancelled: its end was asked for first.)
            if transition.state is JobState.QUEUED:
                # Re-queued by the core; take it out again and record it as failed. (On its
                # last allowed failure the core has failed it already: cancel would refuse.)
                self.core.cancel(job.id, self.clock())
            job.state = JobState.FAILED
            job.reason = f"refused by the node: {reason}"
            transition = Transition(job.id, JobState.FAILED, job.reason)
        if transition:
            await self._record(transition)
        self.request_pass()

    async def _preempt(self, decision: Preempt) -> None:
        job = self.core.jobs.get(decision.job_id)
        if job is None:  # it ended (and was forgotten) before this task ran
            return
        now = self.clock()
        detail: dict[str, Any] = {"reason": decision.reason}
        if decision.grace_s is not None:
            detail["grace_s"] = min(decision.grace_s, self.config.max_grace_s)
        await self._persist([job], [(now, job.id, None, "preempted", detail)])
        log.info("job=%s preempted reason=%s", job.id, decision.reason)
        for node, state in job.node_states.items():
            if state != "exited":
                self.tasks.spawn(self._stop_part(job.id, node, decision.reason))

    def preempt(self, decision: Preempt) -> bool:
        """Preempt a running job outside a policy pass (the inference placer, SODA §V-D2).

        Marks the job exactly as ``SchedulingCore.schedule`` marks a policy's Preempt, then
        takes the same stop path: the job is re-queued at the head of its array when its
        parts have exited. Returns False when the job is not running or already stopping.
        """
        job = self.core.jobs.get(decision.job_id)
        if job is None or job.state not in (JobState.STARTING, JobState.RUNNING) \
                or job.stopping:
            return False
        job.stopping = True
        job.reason = PREEMPTED_PREFIX + decision.reason
        self.tasks.spawn(self._preempt(decision))
        return True

    def next_seq(self) -> int:
        """A fresh journal sequence number (jobs the master creates itself, e.g. replicas)."""
        seq = self._seq
        self._seq += 1
        return seq

    def drop_queued(self, job_id: str) -> None:
        """Cancel a waiting job (a feature's job that must not run where the policy puts it)."""
        transition, _ = self.core.cancel(job_id, self.clock())
        if transition is not None:
            self.tasks.spawn(self._record(transition))

    def cancel_restored(self, job_id: str, reason: str) -> None:
        """While restoring (before serving, nothing else writes): cancel a restored job for
        good, written to the store directly."""
        now = self.clock()
        transition, _ = self.core.cancel(job_id, now)
        if transition is not None:  # queued: cancelled at once, nothing runs
            self.store.update_jobs([self.core.jobs[job_id]],
                                   [(now, job_id, None, "cancelled", {"reason": reason})])

    def annotate(self, job_id: str, values: Mapping[str, float]) -> bool:
        """Attach a feature's predictions to a job (see JobActions.annotate)."""
        job = self.core.jobs.get(job_id)
        if job is None:
            return False
        job.annotations.update(values)
        if job.state is JobState.QUEUED:
            self.request_pass()
        return True

    def post_phase(self, job_id: str) -> bool:
        """A running job entered its post phase: lend its GPUs, journal it, ask for a pass."""
        if not self.core.enter_post_phase(job_id):
            return False
        job = self.core.jobs[job_id]
        self.tasks.spawn(self._persist([job], [(self.clock(), job_id, None, "post_phase",
                                                {})]))
        self.request_pass()
        return True

    def launch_placed(self, spec: JobSpec, placement: Placement, id_prefix: str,
                      reason: str) -> Job:
        """Start a job on exactly ``placement``, bypassing the queue (an inference replica)
        but not the node filter or the permit (SchedulingCore.start_placed).

        Its resources are taken at once, so the next pass sees them taken; the job is
        journalled, then launched by the ordinary two-phase launch. A launch that fails ends
        the job: it never waits in the queue for the policy to put it elsewhere.
        """
        seq = self.next_seq()
        job_id = f"{id_prefix}-{seq}"
        job = Job(id=job_id, spec=spec, submit_time=self.clock(), state=JobState.STARTING,
                  placement=placement, attempts=1,
                  node_states={node: "preparing" for node in placement.nodes})
        self.core.start_placed(job)  # the node filter and the permit; JobError if refused
        self._launching.add(job_id)
        self.tasks.spawn(self._start_placed(seq, job, reason))
        return job

    async def _start_placed(self, seq: int, job: Job, reason: str) -> None:
        try:
            await self.journal.call(Store.insert_jobs, [(seq, job)])
        except Exception as exc:
            log.error("job=%s cannot be journalled: %s", job.id, exc)
            self._launching.discard(job.id)
            # Free its resources and end it (in memory: it never reached the journal).
            self.core.start_failed(job.id, f"not journalled: {exc}", self.clock())
            if self.core.jobs[job.id].state is JobState.QUEUED:
                self.core.cancel(job.id, self.clock())
            self.note_ended(job.id)  # counted like any ended job, so it is forgotten too
            return
        log.info("job=%s launching on its given placement reason=%r", job.id, reason)
        await self._launch(job)
        if job.state is JobState.QUEUED:  # the node refused it: never let the policy run it
            self.drop_queued(job.id)
            self.request_pass()

    async def _command(self, node: str, type_: str, body: Any,
                       timeout_s: float | None = None) -> dict[str, Any]:
        if self.halted:
            raise CommandFailed(node, type_, "not_leader", "this master no longer leads")
        session = self.sessions.get(node)
        if session is None:
            raise CommandFailed(node, type_, "node_unreachable", "the node is not connected")
        # Every command carries the epoch this master leads at: a node that has seen a
        # newer one refuses it (noded/fencing.py).
        wire = dict(body) if isinstance(body, dict) else encode(body)
        wire["epoch"] = self.leadership.epoch
        if timeout_s is None:
            return await session.request(type_, wire)
        return await session.request(type_, wire, timeout_s)

    async def _push(self, node: str, type_: str, body: dict[str, Any]) -> None:
        """A frame without an ack to ``node`` (relayed streams); dropped if not connected."""
        session = self.sessions.get(node)
        if session is not None and not self.halted:
            await session.push(type_, body)

    async def _stop_part(self, job_id: str, node: str, reason: str, record: bool = True
                         ) -> None:
        """Stop one part: SIGTERM, SIGKILL after the job's grace; a job a priority class
        preempts gets the class's grace, its own --signal as the warning and the reason
        written for it on the node."""
        job = self.core.jobs.get(job_id)
        config = self.config
        preemption = self._preemption(job) if job is not None else None
        if preemption is not None:
            reason, grace = preemption
            grace = min(grace, config.max_grace_s)
        else:
            # The job's own --grace, else stop_grace_s; capped by max_grace_s.
            grace = (grace_for(job.spec, config.stop_grace_s, config.max_grace_s) if job
                     else min(config.stop_grace_s, config.max_grace_s))
        preempted = preemption is not None
        warning = (job.spec.stop.warning.signal if preempted and job is not None
                   and job.spec.stop.warning is not None else None)
        try:
            await self._command(node, "stop_job", StopJob(
                job_id=job_id, grace_s=grace, reason=reason[:256],
                restarts=job.restarts if job else None, warning=warning,
                preempted=preempted))
        except CommandFailed as exc:
            # The node will report the job when it reconnects; reconciliation stops it then.
            log.warning("job=%s node=%s stop not delivered: %s", job_id, node, exc.message)

    def _preemption(self, job: Job) -> tuple[str, float] | None:
        """(reason, grace) of a priority class's preemption of ``job`` now being stopped,
        read from the job itself (stopping, to be requeued, "preempted: ..."; all journalled)
        and its class: every stop of it, also one sent again when its start is reported late
        or by a master that took over, warns it and gives it its class's grace. None: not
        so preempted (or cancelled meanwhile: then it ends, and is stopped as any job)."""
        if not (job.stopping and job.end_as == JobState.QUEUED.value
                and job.reason.startswith(PREEMPTED_PREFIX)):
            return None
        found = self.core.classes.of_job(job.spec.priority_class)
        if found is None:
            return None
        return job.reason[len(PREEMPTED_PREFIX):], float(found.preempt_grace_s)

    # -- persistence ---------------------------------------------------------------------
    async def _persist(self, jobs: list[Job], events: list[tuple]) -> None:
        await self.context.journal.persist(jobs, events)

    async def _record(self, transition: Transition, node: str | None = None) -> None:
        job = self.core.jobs.get(transition.job_id)
        if job is None:  # forgotten meanwhile: it ended and was recorded then
            log.debug("job=%s transition %s not recorded: the job is no longer in memory",
                      transition.job_id, transition.state.value)
            return
        detail: dict[str, Any] = {"reason": transition.reason}
        if transition.state.terminal:
            detail.update(exit_code=job.exit_code, signal=job.signal)
        if transition.event == "requeued":
            detail["restarts"] = job.restarts
        await self._persist([job], [(self.clock(), job.id, node,
                                     transition.event or transition.state.value, detail)])
        if transition.state.terminal:
            self.journal.wire.forget(job.id)
        if transition.state is not JobState.RUNNING:
            self._unsettled_starts.pop(job.id, None)
        await self.events.job_transition.emit(job, transition)
        # The routine steps of a healthy job are in the journal (trellisctl events); logging
        # each at info cost a tenth of the master's time at a few hundred jobs a second.
        # Failures, cancellations and re-queues are what an operator reads logs for.
        log.log(logging.DEBUG if transition.state in _ROUTINE else logging.INFO,
                "job=%s state=%s%s", job.id, transition.state.value,
                f" reason={transition.reason!r}" if transition.reason else "")
        if transition.state.terminal:
            self.events.job_ended.emit(job)
            self.note_ended(job.id)
        if transition.state is not JobState.RUNNING:
            self.request_pass()

    # -- node channel --------------------------------------------------------------------
    async def node_hello(self, session: NodeSession, hello: Hello) -> None:
        inventory = hello.inventory
        name = inventory.name
        old = self.sessions.get(name)
        if old is not None and old is not session:
            old.close()
            await old.ws.close()
        self.sessions[name] = session
        handle = self._grace.pop(name, None)
        if handle:
            handle.cancel()
        self.unreachable.discard(name)
        inventory = self.events.effective_inventory(inventory)
        # What strays held there is reported afresh by this hello (_reconcile).
        self.core.cluster.clear_holds(name)
        self.core.node_up(inventory)  # connected: its other conditions (drained, power) stay
        try:
            await self.journal.call(Store.save_node, inventory, self.is_drained(name),
                                    self.clock())
        except StoreError as exc:
            # The row is what a restarted master knows of the node until its next hello;
            # the node is here now. Refusing the hello (a full disk) would leave it cut off
            # and its jobs unreconciled for nothing: it is saved at its next hello.
            log.warning("node=%s inventory not journalled: %s", name, exc)
        # The node's inventory replaces the old one; jobs on what it no longer has are
        # stopped (the fencing feature) before their resources are claimed.
        await self.events.node_inventory.emit(name, inventory)
        for job in self.core.active_on(name):
            if job.placement and name in job.placement.nodes:
                problem = self.core.claim_restored(job.id)
                if problem:
                    log.log(logging.INFO if job.stopping else logging.ERROR,
                            "job=%s node=%s: %s", job.id, name, problem)
        log.info("node=%s connected gpus=%d cpus=%d jobs_reported=%d", name,
                 len(inventory.gpus), len(inventory.cpus), len(hello.jobs))
        await self._reconcile(name, hello.jobs)
        for job in self.core.active_on(name):
            # A claim refused above may succeed now that the hello's exits are settled
            # (a restored journal may name two jobs on one GPU, one of them ended unseen).
            if job.placement and self.core.cluster.allocation(job.id) != job.placement \
                    and self.core.claim_restored(job.id) is None:
                log.info("job=%s node=%s resources re-claimed once the node's exits were "
                         "settled", job.id, name)
        self.events.node_ready.emit(name)
        self.request_pass()

    def hello_ack(self) -> dict[str, Any]:
        """The body of a hello's ack: the epoch this master leads at and the node lease
        (shared.messages.HelloAck)."""
        return encode(HelloAck(epoch=self.leadership.epoch, lease=self.events.node_lease(),
                               time=self.clock()))

    def check_hello(self, hello: Hello) -> None:
        """Refuse a node's hello before its session opens (ProtocolError: its code and
        sentence go back to the node)."""
        try:
            self.events.hello_check(hello)
        except JobError as exc:
            raise ProtocolError(exc.code, str(exc)) from None

    async def _reconcile(self, node: str, reports: tuple[JobReport, ...]) -> None:
        """Make the master's view of ``node`` agree with what really runs there."""
        now = self.clock()
        mine: set[str] = set()
        for report in reports:
            job = self.core.jobs.get(report.job_id)
            judged = judge_part(job, report.job_id, node, report.restarts)
            if not judged.mine:
                if report.fenced and report.state == "exited":
                    # Stopped by its node on its own (the node lease): journalled as such.
                    await self.events.part_fenced(node, _exit_of(report))
                # Not the master's incarnation here: the fencing feature stops or forgets it.
                await self._stray_part(node, report, judged)
                continue
            assert job is not None
            mine.add(job.id)
            if report.state == "running":
                if job.node_states[node] == "preparing":
                    await self._on_started(job.id, node, job.restarts)
                if job.stopping:
                    self.tasks.spawn(self._stop_part(job.id, node, job.reason))
            elif report.state == "exited":
                await self._on_exited(node, _exit_of(report))
            elif report.state == "prepared" and job.id not in self._launching:
                # A launch the master did not finish (it restarted between the phases).
                await self._abort_launch(job, "the master restarted during the launch")
        reported = mine  # a stale incarnation's report is no news of the master's part
        for transition in self.core.lost_parts(node, reported, now):
            await self._record(transition, node)
        # Jobs whose launch the master lost track of and that this node never started.
        for job in self.core.active_on(node):
            if (
                job.state is JobState.STARTING
                and job.id not in self._launching
                and job.node_states.get(node) == "preparing"
                and job.id not in reported
            ):
                await self._abort_launch(job, "the master restarted before the job started")

    async def _stray_part(self, node: str, report: JobReport, judged: Judgement) -> None:
        """A part the master does not own runs (or ran) on ``node``: the GPUs it holds stay
        out of every placement until its exit is reported (_on_exited), since the node would
        refuse them (gpus_busy); the fencing feature stops it."""
        if report.state != "exited":
            self.core.cluster.hold(node, report.job_id, report.restarts, report.gpus)
        await self.events.stray_part.emit(node, report, judged)

    async def _holders_found(self, node: str, gpus: Sequence[int]) -> bool:
        """``node`` refused ``gpus`` as busy: ask it what it runs, account for every part the
        master does not own (held and stopped, as at a hello), and say whether such a part
        holds any of ``gpus`` -- the refusal was the master's stale view, not the job's
        failure. False if the node cannot say or the holder is a part the master placed
        (then the ledger itself is wrong, and the refusal counts as it always did)."""
        try:
            listed = decode(PartList, await self._command(node, "list_parts", ListParts()))
        except (CommandFailed, SchemaError) as exc:
            log.warning("node=%s parts not listed: %s", node, exc)
            return False
        found = False
        for report in listed.jobs:
            if report.state == "exited":
                continue
            job = self.core.jobs.get(report.job_id)
            judged = judge_part(job, report.job_id, node, report.restarts)
            if judged.mine:
                clash = set(report.gpus) & set(gpus)
                if clash:
                    # The master's own part, on GPUs its ledger has free: the job's claim
                    # failed (a restored journal gave them to two jobs). What runs there
                    # holds them until its exit, whatever the ledger says.
                    log.error("node=%s job=%s holds GPUs %s the master gave another job; "
                              "held until it exits", node, report.job_id, sorted(clash))
                    self.core.cluster.hold(node, report.job_id, report.restarts, report.gpus)
                    found = True
                continue
            await self._stray_part(node, report, judged)
            found = found or bool(set(report.gpus) & set(gpus))
        return found

    async def _forget(self, node: str, job_id: str, restarts: int | None = None) -> None:
        try:
            await self._command(node, "forget_job", ForgetJob(job_id=job_id, restarts=restarts))
        except CommandFailed as exc:
            log.debug("node=%s forget %s not delivered: %s", node, job_id, exc.message)

    async def _on_started(self, job_id: str, node: str, restarts: int = 0,
                          pid: int | None = None) -> None:
        job = self.core.jobs.get(job_id)
        if job is not None:
            judged = judge_part(job, job_id, node, restarts)
            if not judged.mine:  # another incarnation, or not placed there: fenced
                await self._stray_part(node, JobReport(
                    job_id=job_id, state="running", pid=pid, restarts=restarts), judged)
                return
        transition = self.core.node_started(job_id, node, self.clock())
        if job is None:
            # An ended job the master forgot (a late event, e.g. after a partition), or one
            # it never had: nothing to record (a part still running there is stopped when
            # the node next says hello and the master reconciles).
            log.info("node=%s job=%s started, but the job is not in memory; ignored", node,
                     job_id)
            return
        if transition is not None:
            await self._record(transition, node)
        else:
            await self._persist([job], [(self.clock(), job_id, node, "part_started", {})])
        if job.stopping and job.node_states.get(node) == "running":
            # Asked to end while this part was starting: the stop sent then may have reached
            # the node before its start did. Stopping a part twice is harmless; a cancelled
            # part left running is not.
            self.tasks.spawn(self._stop_part(job_id, node, job.reason))

    async def _on_exited(self, node: str, event: JobExited) -> None:
        if self.core.cluster.unhold(node, event.job_id, event.restarts):
            self.request_pass()  # a stray's GPUs are free again
        if event.fenced and await self.events.part_fenced(node, event):
            # Its node stopped it on its own, and the job was settled as after a node loss.
            self.tasks.spawn(self._forget(node, event.job_id, event.restarts))
            return
        running = self.core.jobs.get(event.job_id)
        if running is not None and (event.restarts != running.restarts
                                    or node not in running.node_states):
            # Another incarnation's exit (or a part never placed there): fenced.
            await self._stray_part(node, JobReport(
                job_id=event.job_id, state="exited", exit_code=event.exit_code,
                signal=event.signal, restarts=event.restarts),
                judge_part(running, event.job_id, node, event.restarts))
            return
        if event.reason and running is not None and not running.stopping \
                and not running.state.terminal:
            running.reason = event.reason  # the node knows why (the kernel's OOM killer)
        transition, stop_on = self.core.node_exited(
            event.job_id, node, event.exit_code, event.signal, self.clock()
        )
        job = self.core.jobs.get(event.job_id)
        if job is None:
            log.info("node=%s job=%s exited, but the job is not in memory (ended and "
                     "forgotten, or unknown); telling the node to forget it", node,
                     event.job_id)
        elif transition is None:
            await self._persist([job], [(self.clock(), job.id, node, "part_exited",
                                         {"exit_code": event.exit_code, "signal": event.signal})])
        if transition is not None:
            await self._record(transition, node)
        for other in stop_on:
            self.tasks.spawn(self._stop_part(event.job_id, other, f"rank on {node} failed"))
        # The exit is on disk now: the node may drop its record.
        self.tasks.spawn(self._forget(node, event.job_id, event.restarts))

    async def node_event(self, node: str, type_: str, body: Any) -> None:
        if type_ == "job_started":
            assert isinstance(body, JobStarted)
            await self._on_started(body.job_id, node, body.restarts, body.pid)
        elif type_ == "job_exited":
            assert isinstance(body, JobExited)
            await self._on_exited(node, body)
        elif type_ == "gpu_util":
            assert isinstance(body, GpuUtil)
            self.gpu_util.setdefault(node, {})[body.index] = body
            log.debug("node=%s gpu=%d band=%s util=%.0f", node, body.index, body.band,
                      body.utilization_pct)
        elif type_ == "gpu_health":
            assert isinstance(body, GpuHealth)
            await self._on_gpu_health(node, body)
        elif type_ == "contention":
            assert isinstance(body, Contention)
            log.info("node=%s job=%s contention action=%s value=%d previous=%s reason=%s", node,
                     body.job_id, body.action, body.value, body.previous, body.reason)
            await self.journal.call(Store.update_jobs, [], [(
                self.clock(), body.job_id, node, "contention",
                {"action": body.action, "value": body.value, "previous": body.previous,
                 "reason": body.reason})])
        elif type_ == "job_metric":
            assert isinstance(body, JobMetric)
            job = self.core.jobs.get(body.job_id)
            if self.job_metrics.on_event(node, body, job):
                assert job is not None
                self.events.job_metric.emit(node, job, body)
        else:
            await self.events.node_event.emit(node, body)

    def set_gpu_health(self, node: str, index: int, healthy: bool) -> None:
        """Set one GPU's health in the core's view of ``node`` (see NodeCommands)."""
        view = self.core.cluster.node(node)
        if view is None:
            return
        gpus = tuple(
            replace(g, healthy=healthy) if g.index == index else g
            for g in view.inventory.gpus
        )
        inventory: NodeInventory = replace(view.inventory, gpus=gpus)
        self.core.update_inventory(inventory)
        self.request_pass()

    def set_node_condition(self, node: str, kind: str, reason: str | None) -> None:
        """Set or clear one of a known node's conditions (see NodeCommands)."""
        if self.core.cluster.node(node) is None:
            return
        held = {c.kind: c.reason for c in self.core.node_conditions(node)}
        if held.get(kind) == reason:
            return
        self.core.set_condition(node, kind, reason, self.clock() if reason else None)
        self.request_pass()

    def reinventory(self, node: str) -> None:
        """Take ``node``'s inventory through the features again (see NodeCommands)."""
        view = self.core.cluster.node(node)
        if view is None:
            return
        inventory = self.events.effective_inventory(view.inventory)
        if inventory != view.inventory:
            self.core.update_inventory(inventory)
            self.request_pass()

    async def _on_gpu_health(self, node: str, event: GpuHealth) -> None:
        if self.core.cluster.node(node) is None:
            return
        self.set_gpu_health(node, event.index, event.healthy)
        level = logging.INFO if event.healthy else logging.WARNING
        log.log(level, "node=%s gpu=%d healthy=%s reason=%s", node, event.index, event.healthy,
                event.reason)
        await self.journal.call(Store.update_jobs, [], [(
            self.clock(), None, node, "gpu_health",
            {"gpu": event.index, "healthy": event.healthy, "reason": event.reason,
             "xid": event.xid})])
        await self.events.gpu_health.emit(node, event)
        self.request_pass()

    def node_disconnected(self, session: NodeSession) -> None:
        name = session.name
        if self.sessions.get(name) is not session:
            return
        del self.sessions[name]
        self.core.node_down(name, since=self.clock())  # no session: nothing starts there
        log.warning("node=%s disconnected; unreachable after %.0f s", name,
                    self.config.node_grace_s)
        loop = asyncio.get_running_loop()
        self._grace[name] = loop.call_later(self.config.node_grace_s, self._mark_unreachable,
                                            name)
        # Silent since: the heartbeat noticed it only after a period without any data.
        self.events.node_disconnected.emit(name, self.clock() - session.silent_s)

    def _mark_unreachable(self, name: str) -> None:
        self._grace.pop(name, None)
        if name in self.sessions:
            return
        self.unreachable.add(name)
        jobs = self.core.cluster.jobs_on(name)
        lost_s = self.config.node_lost_s
        log.warning("node=%s unreachable; keeping its jobs=%d %s", name, len(jobs),
                    f"until it is lost ({lost_s:g} s of silence)" if lost_s
                    else "until it returns")

    # -- operator actions ----------------------------------------------------------------
    async def set_drained(self, name: str, drained: bool, reason: str = "") -> None:
        """Drain (with the operator's reason) or undrain a node; journalled before it
        returns, so a restarted master still says why."""
        now = self.clock()
        self.core.set_drained(name, drained, reason, since=now)
        detail = {"reason": reason} if drained and reason else {}
        await self.journal.call(save_drain, name, drained, now, reason, (
            now, None, name, "drained" if drained else "undrained", detail))
        log.info("node=%s %s%s", name, "drained" if drained else "undrained",
                 f" reason={reason!r}" if drained and reason else "")
        self.request_pass()

    def is_drained(self, name: str) -> bool:
        return self.core.conditions.has(name, DRAINED)

    def power_state(self, name: str) -> str | None:
        entry = self.power.get(name)
        return entry[0] if entry is not None else None

    async def set_power(self, name: str, state: str | None, reason: str) -> None:
        """Set or clear a node's power state (see NodeCommands.set_power)."""
        view = self.core.cluster.node(name)
        if view is None:
            raise JobError("unknown_node", f"node {name!r} is not registered")
        if state is not None and state not in POWER_STATES:
            raise JobError("invalid_params", f"power state {state!r} is not one of "
                           f"{', '.join(POWER_STATES)}")
        if state == "powering_down":
            # Checked and set with no await between: no job can be placed there meanwhile.
            jobs = self.core.cluster.jobs_on(name)
            if jobs:
                raise JobError("node_busy", f"node {name} runs {len(jobs)} job(s); only an "
                               "idle node is powered down")
            if self.is_drained(name):
                raise JobError("node_drained", f"node {name} is drained; a drained node is "
                               "never powered down")
        now = self.clock()
        if state is None:
            self.power.pop(name, None)
            self.core.set_condition(name, POWER, None)
        else:
            self.power[name] = (state, now, reason)
            self.core.set_condition(name, POWER, _power_sentence(state, reason), now)
        kind = f"power_{state or 'on'}"
        await self.journal.call(save_power, name, state, now, reason,
                                (now, None, name, kind, {"reason": reason}))
        log.info("node=%s power=%s reason=%r", name, state or "on", reason)
        if state is None:
            self.request_pass()

    def node_status(self, name: str) -> str:
        power = self.power.get(name)
        if power is not None:
            return power[0]
        if name in self.sessions:
            if self.is_drained(name):
                return "drained"
            if self.core.conditions.has(name, MAINTENANCE):
                return "maintenance"
            return self.events.ready_status(name) or "ready"
        told = self.events.node_status(name)  # e.g. "down": declared lost (node loss)
        if told is not None:
            return told
        return "unreachable" if name in self.unreachable else "disconnected"
