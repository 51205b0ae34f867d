"""Report tables: one data structure rendered both as Markdown and as JSON.

Every number of ``docs/results.md`` comes from a :class:`Table` (or from generated prose built
with :func:`fmt`), so the JSON written beside it holds exactly what the Markdown shows. A cell is
``None`` (shown as ``n/a``), a string, a number (shown with the column's format), or a
``Spread`` (mean with min–max over seeds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

NA = "n/a"


@dataclass(frozen=True)
class Spread:
    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return cls(math.fsum(values) / len(values), min(values), max(values))


def fmt(value: Any, spec: str = "{:.1f}") -> str:
    """One cell or number as text. Negative numbers use an ASCII minus; ranges an en dash."""
    if value is None:
        return NA
    if isinstance(value, str):
        return value
    if isinstance(value, Spread):
        if spec.format(value.low) == spec.format(value.high):
            return spec.format(value.mean)
        return f"{spec.format(value.mean)} ({spec.format(value.low)}–{spec.format(value.high)})"
    if isinstance(value, float) and not math.isfinite(value):
        return NA
    return spec.format(value)


def _json_cell(value: Any) -> Any:
    if isinstance(value, Spread):
        return {"mean": value.mean, "min": value.low, "max": value.high}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass
class Table:
    id: str
    columns: list[str]
    formats: list[str]  # one per column; ignored for string cells
    rows: list[list[Any]] = field(default_factory=list)
    caption: str = ""
    # The trellis-sim command line that regenerates the table's numbers (shown under it).
    command: str = ""

    def __post_init__(self) -> None:
        if len(self.formats) != len(self.columns):
            raise ValueError(f"table {self.id}: {len(self.columns)} columns, "
                             f"{len(self.formats)} formats")

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.id}: row has {len(cells)} cells, "
                             f"expected {len(self.columns)}")
        self.rows.append(list(cells))

    def markdown(self) -> str:
        lines = [f"<!-- table: {self.id} -->"]
        if self.caption:
            lines += [f"*{self.caption}*", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join(" --- " for _ in self.columns) + "|")
        for row in self.rows:
            cells = [fmt(v, f).replace("|", "\\|") for v, f in zip(row, self.formats, strict=True)]
            lines.append("| " + " | ".join(cells) + " |")
        if self.command:
            lines += ["", f"Regenerate: `{self.command}`"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "caption": self.caption,
            "command": self.command,
            "columns": self.columns,
            "formats": self.formats,
            "rows": [[_json_cell(v) for v in row] for row in self.rows],
        }
