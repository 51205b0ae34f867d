"""The per-job scorer (``masterd.core.sched2.scorer``) in PyTorch, for training, and how the
trainer stores its decisions.

The layers mirror the numpy forward pass exactly. A decision's candidates vary in number; the
replay stores at most ``stored`` of them (the chosen one and then the shortest by ideal time:
the ones a good policy weighs), padded, with "no job" always in the last column, so a batch
is one tensor. The agent itself acts on every candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from masterd.core.sched2.scorer import DEFAULT_HIDDEN, LAYERS, STATS, ScorerNetwork, ScorerShape
from masterd.core.sched2.state import ScorerObservation


class TorchScorer(nn.Module):
    def __init__(self, shape: ScorerShape, hidden: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.shape = shape
        h = dict(DEFAULT_HIDDEN if hidden is None else hidden)
        self.hidden = h
        self.s1 = nn.Linear(shape.gpus_per_server, h["s1"])
        self.s2 = nn.Linear(h["s1"], h["s2"])
        self.c1 = nn.Linear(2 * h["s2"] + STATS, h["c1"])
        self.a1 = nn.Linear(shape.job_features + h["c1"], h["a1"])
        self.a2 = nn.Linear(h["a1"], h["a2"])
        self.q = nn.Linear(h["a2"], 1)
        self.n1 = nn.Linear(h["c1"], h["n1"])
        self.o = nn.Linear(h["n1"], 1)

    def forward(self, servers: torch.Tensor, jobs: torch.Tensor,
                stats: torch.Tensor) -> torch.Tensor:
        """``servers`` (B, N, M), ``jobs`` (B, C, F), ``stats`` (B, 6) -> (B, C + 1)."""
        f = torch.relu(self.s2(torch.relu(self.s1(servers))))
        pooled = torch.cat((f.mean(dim=1), f.max(dim=1).values), dim=1)
        c = torch.relu(self.c1(torch.cat((pooled, stats), dim=1)))
        x = torch.cat((jobs, c[:, None, :].expand(-1, jobs.shape[1], -1)), dim=2)
        scores = self.q(torch.relu(self.a2(torch.relu(self.a1(x)))))[:, :, 0]
        none = self.o(torch.relu(self.n1(c)))
        return torch.cat((scores, none), dim=1)

    def export(self, time_scale: float, meta: Mapping[str, Any] | None = None) -> ScorerNetwork:
        weights: dict[str, np.ndarray] = {}
        for name in LAYERS:
            layer: nn.Linear = getattr(self, name)
            weights[f"{name}_w"] = layer.weight.detach().cpu().numpy().T.astype(np.float32)
            weights[f"{name}_b"] = layer.bias.detach().cpu().numpy().astype(np.float32)
        return ScorerNetwork(self.shape, weights, time_scale, dict(meta or {}))


class ScorerCodec:
    """Stored form of a scorer decision: ``stored`` candidate rows, "no job" last."""

    def __init__(self, shape: ScorerShape, servers: int, stored: int = 128,
                 hidden: Mapping[str, int] | None = None) -> None:
        self.shape = shape
        self.stored = stored
        self.hidden = dict(DEFAULT_HIDDEN if hidden is None else hidden)
        self.layout = {"servers": (servers, shape.gpus_per_server),
                       "jobs": (stored, shape.job_features), "stats": (STATS,)}
        self.actions = stored + 1

    def make(self) -> TorchScorer:
        return TorchScorer(self.shape, self.hidden)

    def encode(self, observation: ScorerObservation, action: int | None = None
               ) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
        jobs, n = observation.jobs, len(observation.jobs)
        keep = np.arange(n)
        if n > self.stored:
            order = np.argsort(jobs[:, 0], kind="stable")  # shortest ideal time first
            if action is not None and action < n:
                order = np.concatenate(([action], order[order != action]))
            keep = np.sort(order[:self.stored])
        rows = np.zeros((self.stored, self.shape.job_features), dtype=np.float32)
        rows[:len(keep)] = jobs[keep]
        mask = np.zeros(self.actions, dtype=bool)
        mask[:len(keep)] = observation.mask[keep]
        mask[-1] = observation.mask[n]
        stored = -1
        if action is not None:
            stored = self.stored if action == n else int(np.searchsorted(keep, action))
        parts = {"servers": observation.servers, "jobs": rows, "stats": observation.stats}
        return parts, mask, stored

    def export(self, net: nn.Module, time_scale: float,
               meta: Mapping[str, Any]) -> ScorerNetwork:
        assert isinstance(net, TorchScorer)
        return net.export(time_scale, meta)
