"""shared.protocol.check_nesting: containers nested exactly ``limit`` deep pass, one more
level is refused with code too_deep, whatever mix of maps and arrays and wherever it hides."""

from __future__ import annotations

from typing import Any

import pytest

from shared.protocol import MAX_NESTING, ProtocolError, check_nesting


def nested(depth: int, kinds: str, leaf: Any = 0) -> Any:
    """``depth`` containers, outermost first, the kind of each level from ``kinds`` in turn
    ('d' a dict, 'l' a list). Siblings at every level must not change the depth: empty
    containers beside the chain, scalars only beside the innermost level."""
    value = leaf
    for level in reversed(range(depth)):
        innermost = level == depth - 1
        empty_map: Any = 0 if innermost else {}
        empty_list: Any = "s" if innermost else []
        if kinds[level % len(kinds)] == "d":
            value = {"flat": 1, "empty": empty_list, "deep": value, "after": empty_map}
        else:
            value = [1, empty_map, value, empty_list]
    return value


def depth_of(value: Any) -> int:
    """The reference: containers on the longest path, counted recursively."""
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


CASES = ["d", "l", "dl", "ld", "ddl", "lld"]


@pytest.mark.parametrize("kinds", CASES)
@pytest.mark.parametrize("limit", [1, 2, 5, MAX_NESTING])
def test_depth_at_the_limit_passes(kinds: str, limit: int) -> None:
    assert depth_of(nested(limit, kinds)) == limit
    check_nesting(nested(limit, kinds), limit)
    check_nesting(nested(limit - 1, kinds), limit)


@pytest.mark.parametrize("kinds", CASES)
@pytest.mark.parametrize("limit", [1, 2, 5, MAX_NESTING])
def test_one_level_more_is_too_deep(kinds: str, limit: int) -> None:
    assert depth_of(nested(limit + 1, kinds)) == limit + 1
    with pytest.raises(ProtocolError) as info:
        check_nesting(nested(limit + 1, kinds), limit)
    assert info.value.code == "too_deep"
    assert str(limit) in str(info.value)


def test_default_limit_is_max_nesting() -> None:
    check_nesting(nested(MAX_NESTING, "dl"))
    with pytest.raises(ProtocolError) as info:
        check_nesting(nested(MAX_NESTING + 1, "ld"))
    assert info.value.code == "too_deep"


def test_the_deep_branch_may_be_anywhere() -> None:
    limit = 4
    deep = nested(limit, "l")  # fine on its own; one level too deep inside any container
    check_nesting(deep, limit)
    for frame in ({"a": 1, "b": [1, 2], "c": deep},
                  [[1], {"k": 2}, 3, deep],
                  {"first": deep, "last": [[0]]}):
        assert depth_of(frame) == limit + 1
        with pytest.raises(ProtocolError) as info:
            check_nesting(frame, limit)
        assert info.value.code == "too_deep"


def test_scalars_and_wide_values_pass() -> None:
    for value in (0, "text", b"bytes", None, 1.5, True):
        check_nesting(value, 1)
    check_nesting({f"k{i}": [i] * 50 for i in range(500)}, 2)
    check_nesting([[]] * 10_000, 2)
    with pytest.raises(ProtocolError):
        check_nesting([[[]]] * 3, 2)
