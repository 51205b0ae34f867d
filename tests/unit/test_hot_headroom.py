"""masterd.features.inference.GpuNodeHeadroom: the lazily read headroom table of a plan is
the mapping the plan used to build eagerly (GPU nodes only, measured value else default)."""

from __future__ import annotations

import pytest

from masterd.core.cluster import ClusterSnapshot, ClusterState
from masterd.features.inference import GpuNodeHeadroom
from tests.unit.helpers import inventory

DEFAULT = 7.0


@pytest.fixture
def snapshot() -> ClusterSnapshot:
    state = ClusterState()
    state.upsert_node(inventory("g1", gpus=8))
    state.upsert_node(inventory("cpu", gpus=0, cpus=32))
    state.upsert_node(inventory("g2", gpus=4))
    state.upsert_node(inventory("g3", gpus=2))
    state.set_schedulable("g3", False)  # drained GPU nodes were in the table too
    return state.snapshot({})


MEASURED = {"g1": 3.5, "cpu": 9.0, "ghost": 1.0}


def eager(snapshot: ClusterSnapshot, measured: dict[str, float]) -> dict[str, float]:
    """The table as InferenceService.replan built it before."""
    return {name: measured.get(name, DEFAULT)
            for name, view in snapshot.nodes.items() if view.total_gpus > 0}


def test_measured_value_wins_else_default(snapshot: ClusterSnapshot) -> None:
    headroom = GpuNodeHeadroom(snapshot, MEASURED, DEFAULT)
    assert headroom["g1"] == 3.5
    assert headroom["g2"] == DEFAULT
    assert headroom["g3"] == DEFAULT
    assert dict(headroom) == eager(snapshot, MEASURED) == {"g1": 3.5, "g2": DEFAULT,
                                                           "g3": DEFAULT}


@pytest.mark.parametrize("name", ["cpu", "ghost", "nope"])
def test_nodes_without_gpus_and_unknown_nodes_are_absent(snapshot: ClusterSnapshot,
                                                         name: str) -> None:
    headroom = GpuNodeHeadroom(snapshot, MEASURED, DEFAULT)
    with pytest.raises(KeyError):
        headroom[name]
    assert name not in headroom
    assert headroom.get(name, 0.0) == 0.0
    assert headroom.get(name) is None


def test_iteration_and_len(snapshot: ClusterSnapshot) -> None:
    headroom = GpuNodeHeadroom(snapshot, MEASURED, DEFAULT)
    assert list(headroom) == ["g1", "g2", "g3"]
    assert len(headroom) == 3
    assert "g2" in headroom and headroom.get("g2", 0.0) == DEFAULT
    assert sorted(headroom.items()) == [("g1", 3.5), ("g2", DEFAULT), ("g3", DEFAULT)]


def test_empty_cluster() -> None:
    headroom = GpuNodeHeadroom(ClusterState().snapshot({}), MEASURED, DEFAULT)
    assert len(headroom) == 0 and list(headroom) == [] and dict(headroom) == {}
    with pytest.raises(KeyError):
        headroom["g1"]
