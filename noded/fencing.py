"""The node's half of fencing: the newest master epoch it has seen, kept across restarts.

Every command a master sends carries its leadership epoch (the PostgreSQL lease's, or the
SQLite journal's count of master starts; see docs/high-availability.md). A node remembers
the newest epoch it has seen in ``STATE/master_epoch`` and refuses any command from an
older one: a deposed leader that has not noticed yet (frozen, cut off, its clock slow) can
no longer start, stop or signal anything here. The file is written (and fsync'd) before the
command that raised the epoch is carried out, so a noded restart never forgets it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from noded.jobs import JobRefused
from noded.shim import write_atomic

log = logging.getLogger("trellis.node.fencing")

EPOCH_FILE = "master_epoch"


class EpochFence:
    """The newest master epoch this node has seen; ``admit`` refuses older commands."""

    def __init__(self, state_dir: Path | None) -> None:
        """``state_dir`` None: the epoch is kept in memory only (an agent in a test)."""
        self.path = state_dir / EPOCH_FILE if state_dir is not None else None
        self.epoch = self._load()

    def _load(self) -> int:
        if self.path is None:
            return 0
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            # write_atomic never leaves a torn file; an unreadable one was damaged by hand
            # or by the disk. Starting from 0 lets this node be commanded again; say so.
            log.error("master epoch file %s unreadable (%s); starting from epoch 0",
                      self.path, exc)
            return 0
        epoch = data.get("epoch") if isinstance(data, dict) else None
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            log.error("master epoch file %s holds no epoch; starting from epoch 0", self.path)
            return 0
        return epoch

    def learn(self, epoch: int) -> bool:
        """Remember ``epoch`` if it is newer (persisted first); True if it was."""
        if epoch <= self.epoch:
            return False
        try:
            if self.path is not None:
                write_atomic(self.path, {"epoch": epoch, "since": time.time()})
        except OSError as exc:
            # Obeying a master whose epoch a restart would forget would open the fence.
            raise JobRefused("epoch_not_recorded", f"master epoch {epoch} cannot be recorded "
                             f"in {self.path}: {exc.strerror or exc}") from None
        log.info("master epoch=%d (was %d)", epoch, self.epoch)
        self.epoch = epoch
        return True

    def admit(self, epoch: int, command: str) -> None:
        """Let a command of the master's ``epoch`` through, or raise ``stale_epoch``."""
        if epoch < self.epoch:
            raise JobRefused(
                "stale_epoch",
                f"{command} from master epoch {epoch} refused: this node has seen epoch "
                f"{self.epoch}, so a newer master leads")
        self.learn(epoch)
