"""A drain carries the operator's reason: the node's condition says it, `nodes` returns it,
the journal keeps it across a master restart, and an undrain removes it."""

from __future__ import annotations

from pathlib import Path

from control.views import show_nodes_wide
from masterd.api.app import GATE_KEY
from masterd.journal.store import Store
from masterd.main import MasterDaemon
from shared.config import MasterConfig, load_config
from tests.unit.helpers import inventory
from tests.unit.test_ops_master import rpc, write_config


async def started(cfg: Path) -> MasterDaemon:
    d = MasterDaemon(load_config(MasterConfig, cfg, "master"), str(cfg))
    await d.start()
    assert d.master is not None
    return d


async def stop(d: MasterDaemon) -> None:
    if d.runner is not None and not d.runner.app[GATE_KEY].closed:
        await d.close()


async def test_a_drains_reason_is_shown_and_survives_a_restart(tmp_path: Path) -> None:
    cfg = tmp_path / "master.toml"
    write_config(cfg, tmp_path / "state")
    d = await started(cfg)
    try:
        assert d.master is not None
        # Registered as a hello registers it: in the core and in the journal's nodes table.
        node = inventory("n1", gpus=4, cpus=8)
        d.master.core.node_up(node)
        await d.master.journal.call(Store.save_node, node, False, 0.0)
        status, reply = await rpc(d, "drain", {"node": "n1", "reason": "  new   fans\n"})
        # No node daemon is connected here: its status says that first.
        assert status == 200 and reply["result"]["status"] == "disconnected", reply
        status, reply = await rpc(d, "nodes")
        [node] = reply["result"]["nodes"]
        assert [(c["kind"], c["reason"]) for c in node["conditions"]] == [
            ("drained", "drained by an operator: new fans")]
        wide = show_nodes_wide(reply["result"]["nodes"]).splitlines()
        assert wide[0].split()[-1] == "REASON"
        assert wide[1].endswith("drained by an operator: new fans")
        status, reply = await rpc(d, "drain", {"node": "n1", "reason": "x" * 257})
        assert status == 400 and "reason" in reply["error"]["message"], reply
        status, reply = await rpc(d, "events", {"tail": 5})
        drained = [e for e in reply["result"]["events"] if e["kind"] == "drained"]
        assert drained[-1]["detail"] == {"reason": "new fans"}
    finally:
        await stop(d)

    d = await started(cfg)  # a new master reads the journal
    try:
        assert d.master is not None
        conditions = d.master.core.node_conditions("n1")
        assert [(c.kind, c.reason) for c in conditions] == [
            ("disconnected", "the node is not connected to the master"),
            ("drained", "drained by an operator: new fans")]
        assert conditions[1].since is not None
        status, reply = await rpc(d, "undrain", {"node": "n1"})
        assert status == 200, reply
        assert [c.kind for c in d.master.core.node_conditions("n1")] == ["disconnected"]
    finally:
        await stop(d)

    d = await started(cfg)
    try:
        assert d.master is not None
        assert [c.kind for c in d.master.core.node_conditions("n1")] == ["disconnected"]
    finally:
        await stop(d)
