"""Printing a reply in the format ``-o`` asks for: table/wide text, JSON or YAML.

``stream``: one of several documents (``--watch``, ``events --follow``): JSON then takes one
line per document, YAML starts each with ``---``.
"""

from __future__ import annotations

import sys

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FORMATS = ("table", "wide", "json", "yaml", "csv")  # csv: report and share only


def emit(result: Any, text: str, output: str, stream: bool = False) -> None:
    if output == "json":
        import json

        print(json.dumps(result, sort_keys=True) if stream
              else json.dumps(result, indent=2, sort_keys=True))
    elif output == "yaml":
        from control.yamlout import dump

        sys.stdout.write(("---\n" if stream else "") + dump(result))
    else:
        print(text)
    sys.stdout.flush()


def structured(output: str) -> bool:
    """The output is data (JSON/YAML), not text: no table needs rendering."""
    return output in ("json", "yaml")
