from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import (
    ConfigError,
    MasterConfig,
    NodeConfig,
    load_config,
)
from shared.cpulist import format_cpu_list, parse_cpu_list


def test_defaults_and_overrides(tmp_path: Path) -> None:
    cfg = load_config(MasterConfig, None, "master", listen_port=9999, policy=None)
    assert cfg.listen_port == 9999 and cfg.policy == "fifo"


def test_toml_sections(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[node]\nname = "n1"\ncpus = "0-1"\n[gpu]\ncount = 8\nmodel = "V100"\n')
    cfg = load_config(NodeConfig, path, "node")
    assert cfg.name == "n1" and cfg.gpu.count == 8 and cfg.gpu.model == "V100"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[master]\nlisten_port = "x"\n', "master.listen_port: must be an integer"),
        ("[master]\nlisten_port = 70000\n", "master.listen_port: must be at most 65535"),
        ("[master]\nbogus = 1\n", "unknown field(s) 'bogus'"),
        ("[mastr]\n", "unknown section(s) mastr"),
        ("[master\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(MasterConfig, path, "master")
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(MasterConfig, "/nonexistent/x.toml", "master")


def test_cpu_lists() -> None:
    assert parse_cpu_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    with pytest.raises(ValueError, match="empty or negative"):
        parse_cpu_list("3-1")
    with pytest.raises(ValueError, match="is not N or N-M"):
        parse_cpu_list("a")
