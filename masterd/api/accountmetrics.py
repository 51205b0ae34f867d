"""Prometheus series per account (masterd.features.fairshare): jobs by state, GPUs held, jobs
ended, decayed usage and fair-share factor.

Labelled by account only, never by job or user: one series per account and state, so the
number of series is bounded by the account tree (or the tenants in use while no accounts are
configured), whatever the number of jobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.model import JobState

if TYPE_CHECKING:
    from masterd.service.master import Master

LIVE_STATES = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)


class AccountCollector(Collector):
    def __init__(self, master: Master) -> None:
        self.master = master

    def collect(self) -> Iterator[Metric]:
        master = self.master
        feature = master.features.fairshare
        jobs: dict[tuple[str, str], int] = {}
        gpus: dict[str, int] = {}
        for job in master.core.jobs.values():
            if job.state not in LIVE_STATES:
                continue
            account = job.spec.tenant
            key = (account, job.state.value)
            jobs[key] = jobs.get(key, 0) + 1
            if job.placement is not None:
                gpus[account] = gpus.get(account, 0) + job.placement.gpu_count
        rows = feature.rows()
        accounts = sorted({r.account for r in rows} | {a for a, _ in jobs})
        family = GaugeMetricFamily("trellis_account_jobs",
                                   "Jobs queued, starting or running, by account and state.",
                                   labels=["account", "state"])
        for account in accounts:
            for state in LIVE_STATES:
                family.add_metric([account, state.value], jobs.get((account, state.value), 0))
        yield family
        held = GaugeMetricFamily("trellis_account_gpus_allocated",
                                 "GPUs held by the account's starting and running jobs.",
                                 labels=["account"])
        for account in accounts:
            held.add_metric([account], gpus.get(account, 0))
        yield held
        ended = CounterMetricFamily("trellis_account_jobs_ended",
                                    "Jobs that ended since this master started, by account and "
                                    "end state.", labels=["account", "state"])
        for (account, state), n in sorted(feature.ended_counts.items()):
            ended.add_metric([account, state], n)
        yield ended
        usage = GaugeMetricFamily("trellis_account_fairshare_usage",
                                  "Decayed usage of the account's subtree (GPU-hour "
                                  "equivalents, [master.fairshare]).", labels=["account"])
        factor = GaugeMetricFamily("trellis_account_fairshare_factor",
                                   "Fair-share factor of the account (1: used nothing, 0.5: "
                                   "used exactly its share).", labels=["account"])
        for row in rows:
            usage.add_metric([row.account], row.raw_usage)
            factor.add_metric([row.account], row.factor)
        yield usage
        yield factor
