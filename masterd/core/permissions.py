"""Who may ask for what of a job: the QoS classes a client may use, and what a user (not an
admin) may change of their own job. Plain rules over names and specs, no I/O: the master's
job controls (``masterd.features.holds``) apply them at submission and at update.

A user may only *lower* what concerns their job: its QoS class (urgent > prior > normal), its
time limit, its priority. Admins may change anything. Which clients may use ``urgent`` and
``prior`` at all is configuration (``qos_urgent_users``, ``qos_prior_users``: client names, or
``"*"`` for every client).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from shared.model import JobSpec, QosClass
from shared.slurmtime import format_time

QOS_RANK = {QosClass.NORMAL: 0, QosClass.PRIOR: 1, QosClass.URGENT: 2}
EVERYONE = "*"


def qos_refusal(qos: QosClass, client: str, urgent_users: Collection[str],
                prior_users: Collection[str]) -> str | None:
    """Why client ``client`` may not use ``qos`` (None: it may)."""
    if qos is QosClass.URGENT and not _listed(client, urgent_users):
        return (f"client {client!r} may not use qos urgent (the master's qos_urgent_users "
                "does not list it)")
    if qos is QosClass.PRIOR and not _listed(client, prior_users):
        return (f"client {client!r} may not use qos prior (the master's qos_prior_users "
                "does not list it)")
    return None


def _listed(client: str, names: Collection[str]) -> bool:
    return EVERYONE in names or client in names


def priority_refusal(priority: int) -> str | None:
    """At submission a user may lower a job's priority below the default 0, never raise it."""
    if priority > 0:
        return f"priority {priority}: only an admin may give a job a priority above 0"
    return None


def update_refusal(old: JobSpec, changes: Mapping[str, Any]) -> str | None:
    """Why a user may not make these changes to their own job (None: they may): each must
    lower what it changes, or leave it. A job's limit is its spec's (the master writes its
    default in at submission); none at all is the longest there is."""
    qos = changes.get("qos")
    if qos is not None and QOS_RANK[QosClass(qos)] > QOS_RANK[old.qos]:
        return (f"qos {old.qos.value} -> {QosClass(qos).value} raises the job's class; a user "
                "may only lower it (urgent > prior > normal)")
    priority = changes.get("priority")
    if priority is not None and priority > old.priority:
        return (f"priority {old.priority} -> {priority} raises it; a user may only lower a "
                "job's priority")
    limit = changes.get("time_limit_s")
    if limit is not None:
        current = old.time_limit_s
        if current is None:
            return None  # from no limit at all to one: lower
        if limit > current:
            return (f"time limit {format_time(current)} -> {format_time(limit)} "
                    "lengthens it; a user may only shorten a job's time limit")
    return None
