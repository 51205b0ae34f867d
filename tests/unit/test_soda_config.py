"""Configuration of SODA's allocator and placer: the [tuner] section, [master.inference]."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import ConfigError, MasterConfig, NodeConfig, load_config


def test_tuner_is_its_own_section_and_unknown_sections_are_still_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[node]\nname = "n1"\n[gpu]\nrate_window_s = 2.0\n'
                    "[tuner]\nwindow_s = 1.5\nwarmup_s = 0\nreference_windows = 3\n")
    cfg = load_config(NodeConfig, path, "node")
    assert cfg.tuner.window_s == 1.5 and cfg.tuner.reference_windows == 3
    assert cfg.tuner.settle_s == 5.0 and cfg.gpu.rate_window_s == 2.0
    assert load_config(NodeConfig, None, "node", name="n").tuner.window_s == 60.0
    path.write_text('[node]\nname = "n1"\n[tuner]\nwindow_s = 0\n')
    with pytest.raises(ConfigError, match=r"tuner\.window_s"):
        load_config(NodeConfig, path, "node")
    path.write_text('[node]\nname = "n1"\n[tunr]\nwindow_s = 1\n')
    with pytest.raises(ConfigError, match="unknown section"):
        load_config(NodeConfig, path, "node")


def test_master_inference_and_adaptive_settings(tmp_path: Path) -> None:
    path = tmp_path / "master.toml"
    path.write_text("[master]\nadaptive_cpus = true\n"
                    "[master.inference]\nsustain_s = 5\nmbw_headroom_gbps = 12.5\n")
    cfg = load_config(MasterConfig, path, "master")
    assert cfg.adaptive_cpus and cfg.inference.sustain_s == 5.0
    assert cfg.inference.mbw_headroom_gbps == 12.5 and cfg.inference.scale_out_fraction == 0.8
    assert load_config(MasterConfig, None, "master").adaptive_cpus is False
