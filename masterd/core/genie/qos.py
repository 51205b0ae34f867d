"""Users' QoS and the cost-effective model (seeds/genie.md §5.2, §5.4, Eq. 9–13)."""

from __future__ import annotations

from shared.model import QosClass

DEFAULT_THETA = 0.4  # Fig. 10

# Eq. 9: the ECT of each class as a multiple of the task's single-GPU latency Lat(t, <1,1>).
ECT_FACTOR: dict[QosClass, float] = {
    QosClass.URGENT: 0.0,
    QosClass.PRIOR: 1.0,
    QosClass.NORMAL: 2.0,
}


def ect(
    qos: QosClass,
    submit_time: float,
    single_gpu_latency: float,
    deadline: float | None = None,
) -> float:
    """Eq. 9 as an absolute time: submission plus the class's allowance.

    An explicit ``deadline`` (absolute seconds, ``JobSpec.deadline``) overrides the class.
    """
    if deadline is not None:
        return float(deadline)
    return submit_time + ECT_FACTOR[QosClass(qos)] * single_gpu_latency


def cost(d_node: int, d_gpn: int, n_nodes: int, gpus_per_node: int, theta: float) -> float:
    """Eq. 10: normalised GPU occupancy plus θ times the normalised node spread."""
    if n_nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"platform <N={n_nodes}, G={gpus_per_node}> has no GPUs")
    return (d_node * d_gpn) / (n_nodes * gpus_per_node) + theta * d_node / n_nodes


def cer(rate: float, placement_cost: float) -> float:
    """Eq. 11: processing rate per unit of cost."""
    return rate / placement_cost


def meets_ect(latency: float, now: float, expected: float) -> bool:
    """Eq. 12: ``l + t_curr ≤ e``, evaluated as ``l ≤ e − t_curr`` everywhere in Trellis so the
    cached and the from-scratch scheduler round identically."""
    return latency <= expected - now


def waiting_allowance(expected: float, latency: float, now: float) -> float:
    """Eq. 13: how long the task can still wait and meet its ECT (negative once it cannot)."""
    return expected - (latency + now)
