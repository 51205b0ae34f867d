"""Try to open GPU device files and say what the kernel answered: the GPU fence's probe.

Run it as (or inside) a job::

    python3 demo/gpu_escape.py [PATH ...]

Without paths it tries every ``nvidia*`` file in ``$TRELLIS_EMULATED_DEV_DIR`` (where noded
puts the emulated GPUs' device files) or else ``/dev``. Each path is opened read-write, as
CUDA opens them, and one line ``PATH ANSWER`` is printed, ANSWER being ``OK`` or the errno's
name: ``EPERM`` is the device fence refusing, ``ENXIO``/``ENODEV`` a device file the fence let
through to a driver that is not there (emulated GPUs), ``OK`` a real driver's device opened.
The last line is JSON: ``{"results": {PATH: ANSWER, ...}}``.

Standard library only, no Trellis import: it runs as any user, under any Python 3, also in a
container image with a Python. A benchmark counts escapes as the paths of GPUs the job was not
given whose answer is anything but ``EPERM`` (:func:`escapes`).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterable

DEV_DIR_ENV = "TRELLIS_EMULATED_DEV_DIR"
DENIED = "EPERM"


def open_answer(path: str) -> str:
    """``OK`` if ``path`` opens read-write, else the errno's name."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    os.close(fd)
    return "OK"


def default_paths() -> list[str]:
    root = os.environ.get(DEV_DIR_ENV) or "/dev"
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("nvidia"))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names]


def probe(paths: Iterable[str]) -> dict[str, str]:
    return {path: open_answer(path) for path in paths}


def escapes(results: dict[str, str], not_given: Iterable[str]) -> int:
    """How many of the ``not_given`` paths the fence failed to refuse."""
    return sum(1 for path in not_given if results.get(path) != DENIED)


def main(argv: list[str]) -> int:
    paths = argv or default_paths()
    results = probe(paths)
    for path, answer in results.items():
        print(f"{path} {answer}")
    print(json.dumps({"results": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
