"""MBM counters: bandwidth from two reads, Unavailable/Error, decreases, node totals."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rdt import BandwidthMeter, FeatureUnavailable, InvalidValue, Resctrl
from rdt.emulated import advance_mbm, build_tree, open_resctrl, set_counter
from rdt.monitor import parse_counter


@pytest.fixture
def rc(tmp_path: Path) -> Resctrl:
    rc = open_resctrl(build_tree(tmp_path / "resctrl", "full").root)
    rc.create_group("trellis-a")
    return rc


def test_parse_counter(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_counter("123456\n") == 123456
    assert parse_counter("Unavailable\n") is None
    assert parse_counter("Error") is None
    assert parse_counter("Unassigned") is None
    with caplog.at_level(logging.WARNING, logger="trellis.rdt"):
        assert parse_counter("12 bytes") is None
    assert "unparseable" in caplog.text


def test_bandwidth_is_the_difference_of_two_reads(rc: Resctrl) -> None:
    meter = BandwidthMeter()
    assert meter.update("trellis-a", rc.read_mbm("trellis-a"), now=100.0) == {}
    advance_mbm(rc.root, "trellis-a", 0, 4_000_000)
    advance_mbm(rc.root, "trellis-a", 1, 1_000_000, local_bytes=250_000)
    assert rc.read_mbm("trellis-a") == {0: 4_000_000, 1: 1_000_000}
    assert rc.read_mbm("trellis-a", event="mbm_local_bytes") == {0: 4_000_000, 1: 250_000}
    assert meter.update("trellis-a", rc.read_mbm("trellis-a"), now=102.0) == {
        0: 2_000_000.0, 1: 500_000.0,
    }
    advance_mbm(rc.root, "trellis-a", 0, 1_000_000)
    assert meter.update("trellis-a", rc.read_mbm("trellis-a"), now=103.0) == {
        0: 1_000_000.0, 1: 0.0,
    }


def test_unavailable_reads_skip_the_domain_and_restart_it(rc: Resctrl) -> None:
    meter = BandwidthMeter()
    meter.update("trellis-a", rc.read_mbm("trellis-a"), now=0.0)
    advance_mbm(rc.root, "trellis-a", 0, 1000)
    set_counter(rc.root, "trellis-a", 1, "mbm_total_bytes", "Unavailable")
    reading = rc.read_mbm("trellis-a")
    assert reading == {0: 1000, 1: None}
    assert meter.update("trellis-a", reading, now=1.0) == {0: 1000.0}
    set_counter(rc.root, "trellis-a", 1, "mbm_total_bytes", 5000)
    # The first number after Unavailable only starts a new interval.
    assert meter.update("trellis-a", rc.read_mbm("trellis-a"), now=2.0) == {0: 0.0}
    advance_mbm(rc.root, "trellis-a", 1, 3000)
    assert meter.update("trellis-a", rc.read_mbm("trellis-a"), now=3.0) == {0: 0.0, 1: 3000.0}
    set_counter(rc.root, "trellis-a", 0, "mbm_total_bytes", "Error")
    assert rc.read_mbm("trellis-a")[0] is None


def test_a_decrease_is_a_reset_and_that_interval_is_skipped(rc: Resctrl) -> None:
    meter = BandwidthMeter()
    set_counter(rc.root, "trellis-a", 0, "mbm_total_bytes", 10_000_000)
    meter.update("trellis-a", rc.read_mbm("trellis-a"), now=0.0)
    set_counter(rc.root, "trellis-a", 0, "mbm_total_bytes", 2_000)
    assert 0 not in meter.update("trellis-a", rc.read_mbm("trellis-a"), now=1.0)
    assert meter.resets == 1
    advance_mbm(rc.root, "trellis-a", 0, 6_000)
    assert meter.update("trellis-a", rc.read_mbm("trellis-a"), now=3.0)[0] == 3_000.0


def test_recreated_group_counts_from_zero(rc: Resctrl) -> None:
    meter = BandwidthMeter()
    advance_mbm(rc.root, "trellis-a", 0, 5_000)
    meter.update("trellis-a", rc.read_mbm("trellis-a"), now=0.0)
    rc.remove_group("trellis-a")
    rc.create_group("trellis-a")  # a fresh RMID: counters restart
    advance_mbm(rc.root, "trellis-a", 0, 100)
    assert 0 not in meter.update("trellis-a", rc.read_mbm("trellis-a"), now=1.0)
    assert meter.resets == 1


def test_meter_edge_cases() -> None:
    meter = BandwidthMeter()
    meter.update("g", {0: 100, 1: 100}, now=10.0)
    assert meter.update("g", {0: 200, 1: 300}, now=10.0) == {}  # no interval: keep older read
    assert meter.update("g", {0: 300, 1: 500}, now=12.0) == {0: 100.0, 1: 200.0}
    meter.update("g", {0: 400}, now=13.0)  # domain 1 vanished (CPUs offline): forget it
    assert meter.update("g", {0: 400, 1: 900}, now=14.0) == {0: 0.0}
    meter.update("h", {0: 1}, now=14.0)
    assert meter.groups() == ["g", "h"]
    meter.forget("g")
    assert meter.groups() == ["h"]


def test_monitor_group_traffic_shows_in_its_control_group_and_node_total(rc: Resctrl) -> None:
    rc.create_mon_group("trellis-m", "trellis-a")
    rc.fs.mkdir(rc.root / "other", what="another tool's group")
    advance_mbm(rc.root, "trellis-a", 0, 700, mon_group="trellis-m")
    advance_mbm(rc.root, "trellis-a", 0, 300)
    advance_mbm(rc.root, None, 1, 50)
    advance_mbm(rc.root, "other", 1, 20)
    assert rc.read_mbm("trellis-a", "trellis-m") == {0: 700, 1: 0}
    assert rc.read_mbm("trellis-a") == {0: 1000, 1: 0}
    assert rc.read_mbm(None) == {0: 0, 1: 50}
    assert rc.read_node_mbm() == {0: 1000, 1: 70}
    set_counter(rc.root, "other", 1, "mbm_total_bytes", "Unavailable")
    assert rc.read_node_mbm() == {0: 1000, 1: None}


def test_llc_occupancy(rc: Resctrl) -> None:
    set_counter(rc.root, "trellis-a", 1, "llc_occupancy", 3 << 20)
    assert rc.read_llc_occupancy("trellis-a") == {0: 0, 1: 3 << 20}


def test_monitoring_errors(tmp_path: Path, rc: Resctrl) -> None:
    with pytest.raises(InvalidValue, match="unknown monitoring event"):
        rc.read_counters("trellis-a", "mbm_bogus")
    cmt_only = open_resctrl(
        build_tree(tmp_path / "cmt", "full", mon_features=("llc_occupancy",)).root
    )
    cmt_only.create_group("trellis-a")
    assert cmt_only.capabilities.l3_mon is not None and not cmt_only.capabilities.l3_mon.mbm
    with pytest.raises(FeatureUnavailable, match="mbm_total_bytes"):
        cmt_only.read_mbm("trellis-a")
    assert cmt_only.read_llc_occupancy("trellis-a") == {0: 0, 1: 0}


def test_gaps_domains_in_counters(tmp_path: Path) -> None:
    rc = open_resctrl(build_tree(tmp_path / "r", "gaps").root)
    rc.create_group("trellis-a")
    advance_mbm(rc.root, "trellis-a", 2, 64)
    assert rc.read_mbm("trellis-a") == {0: 0, 2: 64}
    with pytest.raises(FileNotFoundError):
        set_counter(rc.root, "trellis-a", 1, "mbm_total_bytes", 5)
