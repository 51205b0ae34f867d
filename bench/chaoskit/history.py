"""The history: every client operation with its outcome as the client saw it (Jepsen's).

An operation is recorded when it completes, with the wall-clock times it was invoked and
completed, who invoked it, what it asked and what came back: ``ok`` (the master said yes),
``fail`` (the master said no, with its error code) or ``info`` (no answer: a timeout or a
dropped connection, so the operation may or may not have taken effect). The file is JSON
lines, written as it grows, so an interrupted soak still leaves it for replay.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OUTCOMES = ("ok", "fail", "info")


@dataclass
class Op:
    process: str  # who invoked it: a user, "watcher", "nemesis"
    kind: str  # submit, submit_many, cancel, hold, release, update, pty, observe, fault, ...
    invoked: float
    completed: float
    outcome: str
    args: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")


class History:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._ops: list[Op] = []
        self._lock = threading.Lock()
        self._file = open(path, "a", buffering=1) if path is not None else None  # noqa: SIM115

    def record(self, op: Op) -> Op:
        with self._lock:
            self._ops.append(op)
            if self._file is not None:
                self._file.write(json.dumps(asdict(op), default=str) + "\n")
        return op

    def ops(self, kind: str | None = None) -> list[Op]:
        with self._lock:
            return [op for op in self._ops if kind is None or op.kind == kind]

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @classmethod
    def load(cls, path: Path) -> History:
        history = cls()
        for line in path.read_text().splitlines():
            if line.strip():
                history._ops.append(Op(**json.loads(line)))
        return history


def now() -> float:
    return time.time()
