"""SCHED²'s Q-network (seeds/sched2.md Eq. 3–5) in PyTorch, exported for the numpy forward pass.

The layers mirror ``masterd.core.sched2.network`` exactly: one MLP shared by every server's
row, one over the job vector, their outputs concatenated, two fully connected layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from masterd.core.sched2.network import DEFAULT_HIDDEN, LAYERS, QNetwork, Shape


class TorchQNet(nn.Module):
    def __init__(self, shape: Shape, hidden: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.shape = shape
        widths = dict(DEFAULT_HIDDEN if hidden is None else hidden)
        self.hidden = widths
        self.s1 = nn.Linear(shape.gpus_per_server, widths["s1"])
        self.s2 = nn.Linear(widths["s1"], widths["s2"])
        self.j1 = nn.Linear(shape.job_features, widths["j1"])
        self.j2 = nn.Linear(widths["j1"], widths["j2"])
        self.f1 = nn.Linear(shape.servers * widths["s2"] + widths["j2"], widths["f1"])
        self.f2 = nn.Linear(widths["f1"], shape.actions)

    def forward(self, servers: torch.Tensor, jobs: torch.Tensor) -> torch.Tensor:
        """``servers`` (B, N, M), ``jobs`` (B, D) -> Q-values (B, J + 1)."""
        f = torch.relu(self.s2(torch.relu(self.s1(servers))))  # the same weights per server
        g = torch.relu(self.j2(torch.relu(self.j1(jobs))))
        e = torch.cat((f.flatten(1), g), dim=1)
        out: torch.Tensor = self.f2(torch.relu(self.f1(e)))
        return out

    def export(self, time_scale: float, meta: Mapping[str, Any] | None = None) -> QNetwork:
        """The weights in the numpy layout (``x @ w + b``)."""
        weights: dict[str, np.ndarray] = {}
        for name in LAYERS:
            layer: nn.Linear = getattr(self, name)
            weights[f"{name}_w"] = layer.weight.detach().cpu().numpy().T.astype(np.float32)
            weights[f"{name}_b"] = layer.bias.detach().cpu().numpy().astype(np.float32)
        return QNetwork(self.shape, weights, time_scale, dict(meta or {}))

    @classmethod
    def from_numpy(cls, network: QNetwork) -> TorchQNet:
        hidden = {name: int(network.weights[f"{name}_w"].shape[1]) for name in LAYERS}
        net = cls(network.shape, hidden)
        with torch.no_grad():
            for name in LAYERS:
                layer: nn.Linear = getattr(net, name)
                layer.weight.copy_(torch.from_numpy(network.weights[f"{name}_w"].T.copy()))
                layer.bias.copy_(torch.from_numpy(network.weights[f"{name}_b"].copy()))
        return net


class QNetCodec:
    """How the trainer stores and feeds the paper's agent: its state as it is."""

    def __init__(self, shape: Shape, hidden: Mapping[str, int] | None = None) -> None:
        self.shape = shape
        self.hidden = dict(DEFAULT_HIDDEN if hidden is None else hidden)
        self.layout = {"servers": (shape.servers, shape.gpus_per_server),
                       "jobs": (shape.job_features,)}
        self.actions = shape.actions

    def make(self) -> TorchQNet:
        return TorchQNet(self.shape, self.hidden)

    def encode(self, observation: Any, action: int | None = None
               ) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
        return observation.parts(), observation.mask, -1 if action is None else action

    def export(self, net: nn.Module, time_scale: float, meta: Mapping[str, Any]) -> QNetwork:
        assert isinstance(net, TorchQNet)
        return net.export(time_scale, meta)
