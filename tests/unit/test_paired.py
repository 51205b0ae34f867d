"""The paired per-episode bootstrap of a ratio of means."""

from __future__ import annotations

import pytest

from sim.paired import paired_ratio, speedup


def test_a_constant_ratio_has_a_degenerate_interval() -> None:
    r = paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert (r.ratio, r.low, r.high, r.episodes) == (2.0, 2.0, 2.0, 3)


def test_the_interval_holds_the_ratio_and_pairing_narrows_it() -> None:
    base = [float(v) for v in range(1, 31)]  # episodes of very different size
    better = [v * 1.1 for v in base]
    r = paired_ratio(better, base)
    assert r.low == pytest.approx(1.1) and r.high == pytest.approx(1.1)
    noisy = [v * (1.1 if i % 2 else 0.95) for i, v in enumerate(base)]
    n = paired_ratio(noisy, base)
    assert n.low < n.ratio < n.high
    assert paired_ratio(noisy, base).as_list() == n.as_list()  # seeded


def test_speedup_inverts_and_bad_input_is_refused() -> None:
    assert speedup([1.0, 2.0], [2.0, 4.0]).ratio == 2.0
    with pytest.raises(ValueError, match="same non-zero number"):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        paired_ratio([float("nan")], [1.0])
