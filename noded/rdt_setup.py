"""Open the resctrl mount the node configuration asks for (``[rdt]`` section)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rdt import DEFAULT_ROOT, Resctrl, ResctrlError, detect_resctrl
from rdt.emulated import build_tree, open_resctrl
from shared.config import RdtConfig

log = logging.getLogger("trellis.node.rdt")


def open_node_resctrl(config: RdtConfig, state_dir: Path) -> Resctrl | None:
    """The node's resctrl, or None when there is none to use.

    ``auto``: the kernel's /sys/fs/resctrl when it is mounted, else None (the contention
    eliminator then watches GPU utilisation). An empty emulated tree on a machine without RDT
    would report zero bandwidth forever and hide contention, so ``auto`` never emulates.
    ``real``: the kernel's mount, or a RuntimeError saying why not.
    ``emulated``: the tree at ``emulated_root`` (default STATE_DIR/resctrl), built with
    ``emulated_profile`` the first time; a later start reuses it as it is.
    """
    if config.mode == "off":
        log.info("rdt mode=off")
        return None
    if config.mode == "emulated":
        root = Path(config.emulated_root) if config.emulated_root else state_dir / "resctrl"
        root = Path(os.path.abspath(root))
        if not root.exists() or not any(root.iterdir()):
            build_tree(root, config.emulated_profile)
        try:
            rc = open_resctrl(root)
        except ResctrlError as exc:
            raise RuntimeError(f"emulated resctrl at {root} is not usable: {exc}") from exc
        log.info("rdt mode=emulated root=%s mba=%s mbm=%s", root,
                 rc.capabilities.mb is not None,
                 rc.capabilities.l3_mon is not None and rc.capabilities.l3_mon.mbm)
        return rc
    if config.mode == "real":
        try:
            return Resctrl(DEFAULT_ROOT)
        except ResctrlError as exc:
            raise RuntimeError(
                f"rdt mode=real but resctrl at {DEFAULT_ROOT} is not usable: {exc} "
                "(mount it with 'mount -t resctrl resctrl /sys/fs/resctrl', or use mode auto)"
            ) from exc
    return detect_resctrl(DEFAULT_ROOT)
