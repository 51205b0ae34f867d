"""Schemata parsing, the kernel's value rules, and writes of only what changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdt import FeatureUnavailable, InvalidValue, KernelRejected, Resctrl, SchemataParseError
from rdt.emulated import EmulatedFs, build_tree
from rdt.schemata import (
    MAX_MBPS,
    cbm_problem,
    diff_schemata,
    format_line,
    parse_schemata,
    round_mb_percent,
    ways_to_mask,
)
from shared.kernelfs import KernelWriter


class RecordingWriter(KernelWriter):
    """A real KernelWriter that also remembers what it wrote, to check the exact lines."""

    def __init__(self, roots: list[Path]) -> None:
        super().__init__(roots)
        self.values: list[tuple[str, str]] = []

    def write(self, path: Path, value: str, *, what: str, compare: bool = True) -> bool:
        changed = super().write(path, value, what=what, compare=compare)
        if changed:
            self.values.append((Path(path).name, value))
        return changed


def open_recording(tmp_path: Path, profile: str, **kw: object) -> tuple[Resctrl, RecordingWriter]:
    tree = build_tree(tmp_path / "resctrl", profile, **kw)
    writer = RecordingWriter([tree.root])
    rc = Resctrl(tree.root, tree.mounts, fs=EmulatedFs(tree.root, writer))
    rc.create_group("trellis-a")
    return rc, writer


# ---------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("L3:0=7ff;1=7ff\nMB:0=100;1=100\n", {"L3": {0: 0x7FF, 1: 0x7FF}, "MB": {0: 100, 1: 100}}),
        # Older kernels: names right-aligned, values zero- or space-padded.
        ("    MB:0=100;1= 50\n    L3:0=007ff;1=00003\n",
         {"MB": {0: 100, 1: 50}, "L3": {0: 0x7FF, 1: 0x3}}),
        ("MB:0=2048;1=  16;2=2048;3=2048\n", {"MB": {0: 2048, 1: 16, 2: 2048, 3: 2048}}),
        ("L3DATA:0=fffff;1=fffff;2=3c0;3=fffff\nL3CODE:0=fffff;1=fffff;2=fffff;3=fffff\n",
         {"L3DATA": {0: 0xFFFFF, 1: 0xFFFFF, 2: 0x3C0, 3: 0xFFFFF},
          "L3CODE": {0: 0xFFFFF, 1: 0xFFFFF, 2: 0xFFFFF, 3: 0xFFFFF}}),
        ("L3:0=fff;2=fff\r\n\r\nMB:0=10;2=90;\n",
         {"L3": {0: 0xFFF, 2: 0xFFF}, "MB": {0: 10, 2: 90}}),
        ("L3:uninitialized\nMB:uninitialized\n", {"L3": {}, "MB": {}}),
        ("SMBA:0=2048\n", {"SMBA": {0: 2048}}),
        ("", {}),
    ],
)
def test_parse_kernel_formats(text: str, expected: dict) -> None:
    assert {r: dict(v) for r, v in parse_schemata(text).lines.items()} == expected


@pytest.mark.parametrize(
    "text",
    ["L3 0=7ff", "L3:0:7ff", "MB:0=abc", "MB:0=-5", "L3:x=7ff", "L3:0=zz", "L3:0=",
     "L3:0=7ff\nL3:0=7ff", "L3:0=7ff;0=3", "l3:0=7ff", ":0=7ff"],
)
def test_parse_rejects_malformed_text_naming_the_line(text: str) -> None:
    with pytest.raises(SchemataParseError, match="schemata line"):
        parse_schemata(text)


def test_format_and_diff() -> None:
    assert format_line("L3", {2: 0xF, 0: 0x7FF}) == "L3:0=7ff;2=f"
    assert format_line("MB", {0: 50}) == "MB:0=50"
    current = parse_schemata("L3:0=7ff;1=7ff\nMB:0=100;1=50\n")
    assert diff_schemata(current, {"MB": {0: 100, 1: 60}, "L3": {0: 0x7FF}}) == {"MB": {1: 60}}
    with pytest.raises(InvalidValue, match="no cache id 5"):
        diff_schemata(current, {"MB": {5: 10}})
    with pytest.raises(InvalidValue, match="'L2'"):
        diff_schemata(current, {"L2": {0: 1}})


# ---------------------------------------------------------------------------------- rounding


@pytest.mark.parametrize(
    ("value", "min_bw", "gran", "expected"),
    [
        (0, 10, 10, 10), (5, 10, 10, 10), (10, 10, 10, 10), (11, 10, 10, 20), (55, 10, 10, 60),
        (95, 10, 10, 100), (100, 10, 10, 100), (150, 10, 10, 100),
        (7, 5, 5, 10), (12, 5, 5, 15), (1, 1, 1, 1),
        # min_bandwidth not a multiple of the granularity: the kernel rounds up to a multiple
        # of the granularity (roundup(bw, bw_gran)), so 10 with gran 20 is stored as 20.
        (10, 10, 20, 20), (41, 10, 20, 60),
    ],
)
def test_mb_percent_rounds_like_the_kernel(
    value: int, min_bw: int, gran: int, expected: int
) -> None:
    assert round_mb_percent(value, min_bandwidth=min_bw, bandwidth_gran=gran) == expected


@pytest.mark.parametrize("bad", [-1, True, "50", 50.0, None])
def test_mb_percent_rejects_bad_values(bad: object) -> None:
    with pytest.raises(InvalidValue):
        round_mb_percent(bad, min_bandwidth=10, bandwidth_gran=10)  # type: ignore[arg-type]


def test_set_mb_percent_mode_rounds_and_skips_no_ops(tmp_path: Path) -> None:
    rc, writer = open_recording(tmp_path, "full")
    assert rc.set_mb("trellis-a", 55) == {0: 60, 1: 60}
    assert rc.schemata("trellis-a").get("MB") == {0: 60, 1: 60}
    assert writer.values == [("schemata", "MB:0=60;1=60\n")]
    assert rc.set_mb("trellis-a", 58) == {0: 60, 1: 60}  # rounds to what is there: no write
    assert writer.writes == 1
    assert rc.set_mb("trellis-a", 3) == {0: 10, 1: 10}
    assert rc.set_mb("trellis-a", 250) == {0: 100, 1: 100}
    assert rc.mb_value(31) == 40
    assert writer.writes == 3


def test_set_mb_mbps_mode_passes_megabytes_through(tmp_path: Path) -> None:
    rc, writer = open_recording(tmp_path, "mbps")
    assert rc.schemata("trellis-a").get("MB") == {0: MAX_MBPS, 1: MAX_MBPS}
    assert rc.set_mb("trellis-a", 2500) == {0: 2500, 1: 2500}
    assert rc.schemata("trellis-a").get("MB") == {0: 2500, 1: 2500}
    assert writer.values[-1] == ("schemata", "MB:0=2500;1=2500\n")
    assert rc.set_mb("trellis-a", {1: 55}) == {1: 55}  # no percent rounding in MBps mode
    assert rc.schemata("trellis-a").get("MB") == {0: 2500, 1: 55}
    for bad in (-1, MAX_MBPS + 1):
        with pytest.raises(InvalidValue, match="MBps"):
            rc.set_mb("trellis-a", bad)


def test_set_mb_per_domain_writes_only_that_domain(tmp_path: Path) -> None:
    rc, writer = open_recording(tmp_path, "gaps")
    rc.set_mb("trellis-a", {2: 30})
    assert writer.values == [("schemata", "MB:2=30\n")]
    assert rc.schemata("trellis-a").get("MB") == {0: 100, 2: 30}
    with pytest.raises(InvalidValue, match=r"no cache id 1 .*\[0, 2\]"):
        rc.set_mb("trellis-a", {1: 30})
    with pytest.raises(InvalidValue, match="cache id"):
        rc.set_mb("trellis-a", {-1: 30})


def test_only_the_changed_domains_of_a_foreign_edit_are_rewritten(tmp_path: Path) -> None:
    rc, writer = open_recording(tmp_path, "full")
    rc.set_mb("trellis-a", 60)
    # Someone else lowers domain 0 behind our back; re-applying fixes only that value.
    rc.fs.write(rc.root / "trellis-a" / "schemata", "MB:0=30\n", what="foreign", compare=False)
    writer.values.clear()
    rc.set_mb("trellis-a", 60)
    assert writer.values == [("schemata", "MB:0=60\n")]


def test_set_l3_writes_only_the_l3_line(tmp_path: Path) -> None:
    rc, writer = open_recording(tmp_path, "full")
    rc.set_mb("trellis-a", 50)
    writer.values.clear()
    assert rc.set_l3("trellis-a", 4) == 0xF
    assert writer.values == [("schemata", "L3:0=f;1=f\n")]  # the MB line is not rewritten
    schemata = rc.schemata("trellis-a")
    assert schemata.get("L3") == {0: 0xF, 1: 0xF} and schemata.get("MB") == {0: 50, 1: 50}
    assert rc.set_l3("trellis-a", 4) == 0xF and writer.writes == 2  # no-op second time
    assert rc.set_l3("trellis-a", 2, start=9, domains=[1]) == 0x600
    assert writer.values[-1] == ("schemata", "L3:1=600\n")


def test_set_l3_with_gaps_and_min_bits(tmp_path: Path) -> None:
    rc, writer = open_recording(tmp_path, "gaps", min_cbm_bits=2)
    assert rc.set_l3("trellis-a", 1) == 0x3  # raised to the 2-bit minimum
    assert writer.values == [("schemata", "L3:0=3;2=3\n")]
    assert rc.set_l3("trellis-a", 99) == 0xFFF  # clamped to the whole cache


def test_set_l3_with_cdp_sets_code_and_data_in_one_write(tmp_path: Path) -> None:
    rc, writer = open_recording(tmp_path, "full", cdp=True)
    rc.set_l3("trellis-a", 3)
    assert writer.values == [("schemata", "L3CODE:0=7;1=7\nL3DATA:0=7;1=7\n")]
    assert rc.schemata("trellis-a").get("L3DATA") == {0: 7, 1: 7}


def test_ways_to_mask_and_cbm_rules() -> None:
    assert ways_to_mask(3, cbm_len=11, min_cbm_bits=1) == 0b111
    assert ways_to_mask(3, cbm_len=11, min_cbm_bits=1, start=4) == 0b1110000
    assert ways_to_mask(1, cbm_len=11, min_cbm_bits=2) == 0b11
    assert ways_to_mask(20, cbm_len=11, min_cbm_bits=1) == 0x7FF
    for kwargs in ({"ways": 0}, {"ways": 4, "start": 8}, {"ways": 2, "start": -1}):
        with pytest.raises(InvalidValue):
            ways_to_mask(**{"cbm_len": 11, "min_cbm_bits": 1, **kwargs})  # type: ignore[arg-type]
    assert cbm_problem(0x5, cbm_mask=0x7FF, min_cbm_bits=1) == (
        "The mask 5 has non-consecutive 1-bits"
    )
    assert cbm_problem(0x800, cbm_mask=0x7FF, min_cbm_bits=1) == "Mask out of range"
    assert cbm_problem(0x0, cbm_mask=0x7FF, min_cbm_bits=1) == "Mask out of range"
    assert cbm_problem(0x4, cbm_mask=0x7FF, min_cbm_bits=2) == "Need at least 2 bits in the mask"
    assert cbm_problem(0x3C, cbm_mask=0x7FF, min_cbm_bits=2) is None


def test_kernel_refusals_carry_last_cmd_status(tmp_path: Path) -> None:
    rc, writer = open_recording(tmp_path, "full")
    with pytest.raises(KernelRejected, match="non-consecutive 1-bits") as exc:
        rc.set_schemata("trellis-a", {"L3": {0: 0b101}})
    assert exc.value.status == "The mask 5 has non-consecutive 1-bits"
    with pytest.raises(KernelRejected, match=r"MB value 5 out of range \[10,100\]"):
        rc.set_schemata("trellis-a", {"MB": {0: 5}})
    assert writer.writes == 0
    assert rc.schemata("trellis-a").get("L3") == {0: 0x7FF, 1: 0x7FF}  # nothing half-applied


def test_missing_features_are_clear_errors(tmp_path: Path) -> None:
    rc, _ = open_recording(tmp_path, "no_mb")
    with pytest.raises(FeatureUnavailable, match="memory bandwidth allocation"):
        rc.set_mb("trellis-a", 50)
    with pytest.raises(InvalidValue, match="'MB' is not in this group's schemata"):
        rc.set_schemata("trellis-a", {"MB": {0: 50}})


@given(
    st.dictionaries(st.integers(0, 255), st.integers(1, 0xFFFFF), min_size=1, max_size=8),
    st.sampled_from(["L3", "L3DATA", "L2", "MB", "SMBA"]),
)
def test_format_then_parse_round_trips(values: dict[int, int], resource: str) -> None:
    text = format_line(resource, values) + "\n"
    assert dict(parse_schemata(text).lines[resource]) == values


@given(st.integers(1, 32), st.integers(1, 40), st.integers(0, 4), st.integers(0, 31))
def test_ways_to_mask_always_satisfies_the_kernel(
    cbm_len: int, ways: int, min_bits: int, start: int
) -> None:
    min_bits = min(min_bits, cbm_len)
    try:
        mask = ways_to_mask(ways, cbm_len=cbm_len, min_cbm_bits=min_bits, start=start)
    except InvalidValue:
        assert start + max(min(max(ways, min_bits), cbm_len), 1) > cbm_len
        return
    assert cbm_problem(mask, cbm_mask=(1 << cbm_len) - 1, min_cbm_bits=min_bits) is None
