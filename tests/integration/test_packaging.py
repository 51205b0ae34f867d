"""systemd units (systemd-analyze) and the Debian package: build, unpack, run what it installs."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.cluster import free_port

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
UNITS = ("trellis-masterd", "trellis-noded")


def systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        reason = ("systemd-analyze is missing (Debian package 'systemd'; ./run test installs it "
                  "when it can)")
        if os.geteuid() != 0:
            reason += "; not root, so it cannot be installed here"
        pytest.skip(reason)
    return tool


def unit_settings(name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (PACKAGING / f"{name}.service").read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.fixture(scope="module")
def man_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("man")
    subprocess.run([sys.executable, str(PACKAGING / "manpage.py"), str(out)], check=True,
                   capture_output=True, cwd=REPO)
    for page in out.iterdir():
        section = out / f"man{page.suffix[1:]}"
        section.mkdir(exist_ok=True)
        page.rename(section / page.name)
    return out


def test_units_pass_systemd_analyze_verify(tmp_path: Path, man_dir: Path) -> None:
    """Every directive is known and valid; only ExecStart is pointed at a stand-in executable
    (the real one is installed by the package, tested below)."""
    tool = systemd_analyze()
    paths = []
    for unit in UNITS:
        stand_in = tmp_path / unit
        stand_in.write_text("#!/bin/sh\nexit 0\n")
        stand_in.chmod(0o755)
        text = (PACKAGING / f"{unit}.service").read_text()
        assert f"ExecStart=/usr/bin/{unit} -c /etc/trellis/" in text
        path = tmp_path / f"{unit}.service"
        path.write_text(text.replace(f"/usr/bin/{unit}", str(stand_in)))
        paths.append(str(path))
    proc = subprocess.run([tool, "verify", *paths], capture_output=True, text=True,
                          env=dict(os.environ, MANPATH=str(man_dir)), timeout=60)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr


def test_unit_policy() -> None:
    master, node = unit_settings("trellis-masterd"), unit_settings("trellis-noded")
    for unit in (master, node):
        assert unit["Type"] == ["notify"] and unit["Restart"] == ["on-failure"]
        assert unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
        assert "WatchdogSec" in unit and "TimeoutStopSec" in unit
    # Stopping noded must leave jobs (its descendants) running.
    assert node["KillMode"] == ["process"] and "KillMode" not in master
    assert master["User"] == ["trellis"] and master["CapabilityBoundingSet"] == [""]
    for key in ("NoNewPrivileges", "PrivateDevices", "PrivateTmp", "ProtectHome"):
        assert master[key] == ["yes"], key
    assert master["ProtectSystem"] == ["strict"]
    assert master["StateDirectory"] == ["trellis/master"]
    assert node["StateDirectory"] == ["trellis/node"]
    # Every capability noded keeps is explained in the unit.
    text = (PACKAGING / "trellis-noded.service").read_text()
    for cap in node["CapabilityBoundingSet"][0].split():
        assert text.count(cap) >= 2, f"{cap} is kept but not explained"
    # Options jobs would inherit and suffer from are absent from noded.
    for key in ("ProtectSystem", "PrivateTmp", "PrivateDevices", "MemoryDenyWriteExecute",
                "SystemCallFilter", "NoNewPrivileges"):
        assert key not in node, key


def test_master_unit_is_well_sandboxed(tmp_path: Path) -> None:
    tool = systemd_analyze()
    path = tmp_path / "trellis-masterd.service"
    shutil.copy(PACKAGING / "trellis-masterd.service", path)
    proc = subprocess.run([tool, "security", "--offline=yes", "--no-pager", str(path)],
                          capture_output=True, text=True, timeout=60)
    if "--offline" in proc.stderr:
        pytest.skip("this systemd-analyze cannot assess unit files offline")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= 2.0, proc.stdout


def test_default_configs_load() -> None:
    from shared.config import MasterConfig, NodeConfig, load_config

    master = load_config(MasterConfig, PACKAGING / "etc" / "masterd.toml", "master")
    assert master.state_dir == "/var/lib/trellis/master"
    node = load_config(NodeConfig, PACKAGING / "etc" / "noded.toml", "node",
                       name="gpu-01")
    assert node.state_dir == "/var/lib/trellis/node" and node.metrics_port == 0


def test_noded_names_itself_after_the_host_with_the_packaged_config(tmp_path: Path) -> None:
    from noded.main import default_name, parse_args

    packaged = str(PACKAGING / "etc" / "noded.toml")
    assert default_name(packaged) == os.uname().nodename.split(".")[0]
    named = tmp_path / "n.toml"
    named.write_text('[node]\nname = "gpu-07"\n')
    assert default_name(str(named)) is None
    from noded.main import load_node_config

    cfg = load_node_config(str(named), parse_args(["-c", str(named)]))
    assert cfg.name == "gpu-07"


# -- the Debian package ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    for tool in ("dpkg-deb", "dpkg"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing: not a Debian system")
    out = tmp_path_factory.mktemp("deb")
    proc = subprocess.run(["bash", str(PACKAGING / "build-deb.sh"), "-o", str(out), "--fast"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == out
    yield path


@pytest.fixture(scope="module")
def installed(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return root


@pytest.mark.slow
def test_package_metadata_and_contents(deb: Path, tmp_path: Path) -> None:
    info = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True,
                          check=True).stdout
    fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line
                  and not line.startswith(" "))
    assert fields["Package"] == "trellis" and fields["Version"] == "0.1.0"
    assert re.fullmatch(r"python3\.\d+, adduser \| passwd", fields["Depends"])
    listing = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True,
                             text=True, check=True).stdout
    for path in ("./lib/systemd/system/trellis-masterd.service",
                 "./lib/systemd/system/trellis-noded.service",
                 "./etc/trellis/masterd.toml", "./etc/trellis/noded.toml",
                 "./etc/trellis/trellisctl.toml",
                 "./usr/share/bash-completion/completions/trellisctl",
                 "./usr/share/man/man1/trellisctl.1.gz",
                 "./usr/share/man/man8/trellis-masterd.8.gz",
                 "./usr/share/man/man8/trellis-noded.8.gz",
                 "./usr/share/doc/trellis/README.md.gz",
                 "./usr/share/doc/trellis/docs/configuration.md.gz",
                 "./usr/share/doc/trellis/docs/policies/genie.md.gz",
                 "./usr/share/trellis/grafana/trellis-overview.json",
                 "./opt/trellis/bin/trellisctl"):
        assert path in listing, path
    for prog in ("trellis-masterd", "trellis-noded", "trellisctl"):
        assert f"./usr/bin/{prog} -> /opt/trellis/bin/{prog}" in listing
    ctrl = tmp_path / "DEBIAN"
    subprocess.run(["dpkg-deb", "--control", str(deb), str(ctrl)], check=True)
    assert (ctrl / "conffiles").read_text().split() == [
        "/etc/trellis/masterd.toml", "/etc/trellis/noded.toml", "/etc/trellis/trellisctl.toml"]
    for script in ("postinst", "prerm", "postrm"):
        assert os.access(ctrl / script, os.X_OK)
        assert subprocess.run(["sh", "-n", str(ctrl / script)]).returncode == 0


@pytest.mark.slow
def test_installed_programs_run_from_their_own_environment(installed: Path) -> None:
    venv = installed / "opt" / "trellis"
    python = venv / "bin" / "python"
    assert (venv / "pyvenv.cfg").read_text().count("/opt/trellis") >= 1
    for prog in ("trellisctl", "trellis-masterd", "trellis-noded"):
        script = venv / "bin" / prog
        assert script.read_text().startswith("#!/opt/trellis/bin/python\n")
        proc = subprocess.run([str(python), str(script), "--help"], capture_output=True,
                              text=True, timeout=60, cwd="/")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: {prog}")
    # The packaged code, not this checkout, is what runs.
    proc = subprocess.run([str(python), "-c", "import masterd, prometheus_client; "
                                              "print(masterd.__file__)"],
                          capture_output=True, text=True, cwd="/", check=True)
    assert proc.stdout.startswith(str(venv / "lib"))
    # Nothing in the package points back at the build directory.
    leaks = subprocess.run(["grep", "-rIl", "--exclude=*.pyc", "trellis-deb.", str(venv)],
                           capture_output=True, text=True)
    assert leaks.stdout == ""


@pytest.mark.slow
def test_installed_man_pages_and_completion(installed: Path) -> None:
    for page, section in (("trellisctl", 1), ("trellis-masterd", 8), ("trellis-noded", 8)):
        text = gzip.decompress(
            (installed / f"usr/share/man/man{section}/{page}.{section}.gz").read_bytes()).decode()
        assert text.startswith(f".TH {page.upper()} {section} ")
        assert ".SH OPTIONS" in text and "\\-\\-help" in text
        if shutil.which("groff"):
            proc = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=text,
                                  capture_output=True, text=True)
            assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    ctl = gzip.decompress((installed / "usr/share/man/man1/trellisctl.1.gz").read_bytes())
    assert b".SS events" in ctl and b"EXIT STATUS" in ctl
    completion = installed / "usr/share/bash-completion/completions/trellisctl"
    assert "complete -F _trellisctl trellisctl" in completion.read_text()
    assert subprocess.run(["bash", "-n", str(completion)]).returncode == 0


@pytest.mark.slow
def test_installed_tree_runs_at_its_real_paths(installed: Path, tmp_path: Path) -> None:
    """In a private mount namespace, the unpacked /opt/trellis sits at /opt/trellis: the
    /usr/bin links, the #! lines and the environment resolve exactly as on a target, and the
    installed master serves the installed trellisctl."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount the package at /opt/trellis")
    port = free_port()
    state = tmp_path / "state"
    script = f"""
set -e
mount --make-rprivate /
mount -t tmpfs tmpfs /opt
mkdir /opt/trellis
mount --bind {installed}/opt/trellis /opt/trellis
{installed}/usr/bin/trellisctl --help > /dev/null
{installed}/usr/bin/trellis-noded --help > /dev/null
{installed}/usr/bin/trellis-masterd --listen-port {port} --state-dir {state} &
pid=$!
for i in $(seq 1 100); do
    if {installed}/usr/bin/trellisctl --master http://127.0.0.1:{port} -o json nodes \
        > {tmp_path}/nodes.json 2>/dev/null; then break; fi
    sleep 0.1
done
kill -TERM $pid
wait $pid
"""
    started = time.monotonic()
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True,
                          text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "nodes.json").read_text().strip().startswith("{")
    assert '"nodes": []' in (tmp_path / "nodes.json").read_text()
    assert (state / "master.db").exists()
    assert time.monotonic() - started < 60
