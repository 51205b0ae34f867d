"""OCI image references (``[registry[:port]/]path[:tag][@sha256:digest]``), checked where a
job is submitted (CLI, master) and again on the node, with one sentence saying what is wrong.

The grammar is the distribution project's (docker/distribution ``reference``): lower-case
path components separated by ``.``, ``_``, ``__`` or dashes; a tag of word characters, dots
and dashes up to 128; a digest ``algorithm:hex``. A first component with a dot or a colon, or
``localhost``, is a registry host. Nothing here talks to a registry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = (r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*"
         r"[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?")
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}"
MAX_LENGTH = 1024


class ImageRefError(ValueError):
    """An image reference that does not parse; its message is the sentence to show."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # "" when none is named (the node's search registries decide)
    path: str
    tag: str = ""
    digest: str = ""

    def __str__(self) -> str:
        out = f"{self.registry}/{self.path}" if self.registry else self.path
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_image(text: str) -> ImageRef:
    """Parse ``text`` or raise ImageRefError naming what is wrong with it."""
    if not isinstance(text, str) or not text:
        raise ImageRefError("the image reference is empty")
    if len(text) > MAX_LENGTH:
        raise ImageRefError(f"the image reference is longer than {MAX_LENGTH} characters")
    if text != text.strip() or any(c.isspace() for c in text):
        raise ImageRefError(f"image reference {text!r} contains white space")
    rest, digest = text, ""
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not re.fullmatch(_DIGEST, digest):
            raise ImageRefError(f"image reference {text!r} has a malformed digest "
                                f"{digest!r} (expected sha256: and 64 hex digits)")
    registry = ""
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        if not re.fullmatch(_HOST, first):
            raise ImageRefError(f"image reference {text!r} names an invalid registry "
                                f"host {first!r}")
        port = first.rpartition(":")[2] if ":" in first and "]" not in first[-1:] else ""
        if port.isdigit() and not 0 < int(port) < 65536:
            raise ImageRefError(f"image reference {text!r} names an invalid port {port}")
        registry, rest = first, remainder
    tag = ""
    if ":" in rest.rpartition("/")[2]:
        rest, tag = rest.rsplit(":", 1)
        if not re.fullmatch(_TAG, tag):
            raise ImageRefError(f"image reference {text!r} has an invalid tag {tag!r}")
    if not rest:
        raise ImageRefError(f"image reference {text!r} names no repository")
    for component in rest.split("/"):
        if not re.fullmatch(_COMPONENT, component):
            raise ImageRefError(
                f"image reference {text!r} has an invalid repository component "
                f"{component!r} (lower-case letters, digits and . _ - separators only)")
    return ImageRef(registry, rest, tag, digest)
