"""trellisctl as the e2e tests run it: a real subprocess against a LocalCluster's master."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from demo.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]


def ctl(cluster: LocalCluster, *args: str, json_out: bool = True) -> tuple[int, Any, str]:
    """Exit code, output (parsed when ``json_out`` and the command succeeded) and stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "control.cli", "--master", cluster.url,
         *(["-o", "json"] if json_out else []), *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    out: Any = proc.stdout
    if json_out and proc.returncode == 0 and proc.stdout.strip():
        out = json.loads(proc.stdout)
    return proc.returncode, out, proc.stderr
