"""Slurm's ``--dependency`` syntax, to and from :class:`shared.model.Dependency` terms.

``afterok:ID[:ID...]`` (and ``afterany``, ``afternotok``, ``aftercorr``); several terms
separated by commas must all hold. A bare ``ID`` is ``afterany:ID``, as in Slurm. Slurm's
``?`` (any one of the terms), ``after:`` (after the job *started*), ``+TIME`` delays,
``singleton`` and ``afterburstbuffer`` are not supported, and each says so in one sentence.

Shared by ``trellisctl submit --after`` and the simulator's job files (and meant for the
Slurm-script reader), so every place reads the same syntax the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shared.model import DEPENDENCY_TYPES, NAME_PATTERN, Dependency

MAX_TERMS = 64  # JobSpec.after's bound
MAX_IDS = 1024  # Dependency.jobs's bound
_ID = re.compile(NAME_PATTERN)
_UNSUPPORTED = {
    "after": "'after' (start after the job starts) is not supported: Trellis waits for jobs "
             "to end; use afterany, afterok or afternotok",
    "singleton": "'singleton' is not supported; name the jobs to wait for with afterany:ID",
    "afterburstbuffer": "'afterburstbuffer' is not supported (Trellis has no burst buffers)",
}


class DependencyError(ValueError):
    """A dependency string that cannot be used; the message is one sentence naming why."""


def parse_dependency(text: str) -> tuple[Dependency, ...]:
    """``"afterok:prep-3:prep-4,afterany:clean"`` -> its terms, in the order given."""
    raw = text.strip()
    if not raw:
        raise DependencyError("the dependency is empty: give TYPE:ID[:ID...], e.g. "
                              "afterok:prep-3")
    if "?" in raw:
        raise DependencyError(f"dependency {text!r}: '?' (any one of several) is not "
                              "supported; separate terms with ',' (all must hold)")
    terms: list[Dependency] = []
    for part in raw.split(","):
        term = part.strip()
        if not term:
            raise DependencyError(f"dependency {text!r} has an empty term (two commas in a "
                                  "row, or one at an end)")
        kind, colon, rest = term.partition(":")
        if not colon and term.lower() not in _UNSUPPORTED and term.lower() not in \
                DEPENDENCY_TYPES:
            # Slurm's oldest form: a bare job id waits for it to end, however.
            kind, rest = "afterany", term
        kind = kind.strip().lower()
        if kind in _UNSUPPORTED:
            raise DependencyError(f"dependency {text!r}: {_UNSUPPORTED[kind]}")
        if kind not in DEPENDENCY_TYPES:
            raise DependencyError(f"dependency {text!r}: unknown type {kind!r}; use "
                                  f"{', '.join(DEPENDENCY_TYPES)}")
        ids = [i.strip() for i in rest.split(":")]
        for job_id in ids:
            if "+" in job_id:
                raise DependencyError(f"dependency {text!r}: a delay ({job_id!r}) is not "
                                      "supported")
            if not _ID.fullmatch(job_id):
                raise DependencyError(f"dependency {text!r}: {job_id!r} is not a job id "
                                      "(1-63 letters, digits, '-' or '_')")
        if len(ids) > MAX_IDS:
            raise DependencyError(f"dependency {text!r}: a term names at most {MAX_IDS} jobs")
        terms.append(Dependency(type=kind, jobs=tuple(ids)))
    if len(terms) > MAX_TERMS:
        raise DependencyError(f"dependency {text!r}: at most {MAX_TERMS} terms")
    return tuple(terms)


def format_dependency(terms: Iterable[Dependency]) -> str:
    """The terms in Slurm's syntax again (``""`` for none)."""
    return ",".join(format_term(t.type, t.jobs) for t in terms)


def format_term(kind: str, jobs: Iterable[str]) -> str:
    return ":".join((kind, *jobs))
