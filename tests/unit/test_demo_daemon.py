"""demo.cluster's daemons run the code of the tree the harness belongs to, whatever the
working directory of whoever started them (benches compare trees by running each one's)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from demo.cluster import TREE, Daemon


def test_a_daemon_runs_its_own_tree_not_the_working_directorys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    decoy = tmp_path / "other-checkout"
    (decoy / "masterd").mkdir(parents=True)
    (decoy / "masterd" / "__init__.py").write_text("")
    monkeypatch.chdir(decoy)
    env = dict(os.environ, PYTHONPATH=str(TREE))
    daemon = Daemon("probe", [sys.executable, "-c",
                              "import masterd; print(masterd.__file__)"],
                    tmp_path / "probe.log")
    daemon.start(env)
    assert daemon.proc is not None
    assert daemon.proc.wait(30) == 0
    loaded = Path((tmp_path / "probe.log").read_text().strip())
    assert loaded == TREE / "masterd" / "__init__.py"
