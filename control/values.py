"""Parsers of submission values that the command line and batch scripts share (Slurm's
array and dependency syntaxes), apart from both so neither imports the other."""

from __future__ import annotations

from control.usage import UsageError

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_ARRAY = 10_000  # jobs in one submission (Slurm's default MaxArraySize is 1001)
MAX_INDEX = 4_000_000


def parse_array(text: str) -> list[int]:
    """Slurm's ``--array`` indices: ``0-999``, ``1,3,5-7``, ``0-99:2``; sorted, no repeats."""
    spec = text.strip()
    if "%" in spec:
        raise UsageError(f"--array {text!r}: a %N limit on jobs running at once is not "
                         "supported (Trellis has no per-array run limit); drop the %N")
    indices: set[int] = set()
    for part in spec.split(","):
        span, colon, step_text = part.strip().partition(":")
        first_text, dash, last_text = span.partition("-")
        try:
            first = int(first_text)
            last = int(last_text) if dash else first
            step = int(step_text) if colon else 1
        except ValueError:
            raise UsageError(f"--array {text!r}: {part.strip()!r} is not N, N-M or N-M:STEP "
                             "(non-negative integers)") from None
        if colon and not dash:
            raise UsageError(f"--array {text!r}: a step needs a range ({part.strip()!r})")
        if first < 0 or last > MAX_INDEX:
            raise UsageError(f"--array {text!r}: indices must be 0 to {MAX_INDEX}")
        if last < first:
            raise UsageError(f"--array {text!r}: range {span!r} ends before it starts")
        if step < 1:
            raise UsageError(f"--array {text!r}: step {step} must be at least 1")
        if (last - first) // step + 1 + len(indices) > MAX_ARRAY:
            raise UsageError(f"--array {text!r}: more than {MAX_ARRAY} jobs in one array")
        indices.update(range(first, last + 1, step))
    return sorted(indices)


def dependency_wire(text: str, where: str = "--after") -> list[dict[str, Any]]:
    """Slurm's ``--dependency`` syntax as the job spec's ``after`` list."""
    from shared.dependency import DependencyError, parse_dependency

    try:
        terms = parse_dependency(text)
    except DependencyError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return [{"type": t.type, "jobs": list(t.jobs)} for t in terms]


def parse_constraint(text: str, where: str = "--constraint") -> dict[str, list[str]]:
    """Slurm's ``--constraint`` as the spec's selector fields: ``a100&ib`` (every one of
    them on each node: ``features``) or ``a100|h100`` (at least one on each node, nodes may
    differ: ``any_features``). Mixing & with |, brackets and counts are refused."""
    import re

    from shared.model import FEATURE_PATTERN

    spec = text.strip()
    if not spec:
        raise UsageError(f"{where}: names no feature")
    for sign in ("[", "]", "*", "!", "(", ")", ","):
        if sign in spec:
            raise UsageError(f"{where} {text!r}: only features joined by & (all of them) or "
                             f"by | (any of them) are supported, not {sign!r}")
    if "&" in spec and "|" in spec:
        raise UsageError(f"{where} {text!r}: & and | cannot be mixed; give all of the "
                         "features (a&b) or any of them (a|b)")
    joiner, field = ("|", "any_features") if "|" in spec else ("&", "features")
    features = [part.strip() for part in spec.split(joiner)]
    for feature in features:
        if not re.fullmatch(FEATURE_PATTERN, feature):
            raise UsageError(f"{where} {text!r}: {feature!r} is not a feature name (a letter "
                             "or digit, then letters, digits, _ . + -)")
    return {field: list(dict.fromkeys(features))}


def parse_reservation(text: str, where: str = "--reservation") -> str:
    """Slurm's ``--reservation NAME``: the reservation the job runs in."""
    import re

    from shared.model import NAME_PATTERN

    name = text.strip()
    if not re.fullmatch(NAME_PATTERN, name):
        raise UsageError(f"{where} {text!r}: not a reservation name (letters, digits, _ "
                         "and -; `trellisctl reservation list` shows them)")
    return name


def parse_partitions(text: str, where: str = "--partition") -> list[str]:
    """Slurm's ``--partition a,b``: the partitions the job may run in (any that admits it)."""
    import re

    from shared.model import NAME_PATTERN

    names = [part.strip() for part in text.split(",")]
    if not text.strip() or not all(names):
        raise UsageError(f"{where} {text!r}: give partition names separated by commas")
    for name in names:
        if not re.fullmatch(NAME_PATTERN, name):
            raise UsageError(f"{where} {text!r}: {name!r} is not a partition name")
    return list(dict.fromkeys(names))


def parse_hostlist(text: str, where: str = "--exclude") -> list[str]:
    """Slurm's node lists: ``gpu01,gpu07`` and ranges ``gpu[01-04,07]`` (zero-padded as
    written), in order, without repeats."""
    from shared.hostlist import HostlistError, expand

    try:
        return expand(text, where)
    except HostlistError as exc:
        raise UsageError(str(exc)) from None
