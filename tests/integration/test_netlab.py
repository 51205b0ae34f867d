"""demo/netlab.py: sites in namespaces of their own reach each other over the hub, a cut
site is silent both ways (connections time out, nothing is refused) and comes back when
restored, and closing removes every namespace and interface it made."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from demo.netlab import NetLab
from tests.conftest import needs_root

pytestmark = needs_root

LISTEN = "import socket, sys, time; s = socket.socket(); s.bind((sys.argv[1], 9999)); " \
         "s.listen(); print('up', flush=True); time.sleep(120)"


def _connects(address: str, timeout: float = 1.0) -> bool | str:
    try:
        socket.create_connection((address, 9999), timeout=timeout).close()
        return True
    except TimeoutError:
        return False  # silent
    except OSError as exc:
        return str(exc)  # refused or unreachable: not silent


@pytest.mark.parametrize("how", ["link", "drop"])
def test_a_cut_site_is_silent_and_comes_back(how: str) -> None:
    with NetLab() as lab:
        here = lab.add("host", own_namespace=False)
        far = lab.add("far")
        server = subprocess.Popen([*far.wrapper, sys.executable, "-c", LISTEN, far.address],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline() == "up\n"
            assert _connects(far.address) is True
            lab.cut("far", how)
            started = time.monotonic()
            assert _connects(far.address) is False
            assert time.monotonic() - started >= 0.9
            lab.restore("far")
            deadline = time.monotonic() + 10
            while _connects(far.address) is not True:
                assert time.monotonic() < deadline, "the restored site is still cut off"
            assert here.address != far.address
        finally:
            server.kill()
            server.wait()
        names = list(lab.namespaces)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert f"tl{lab.tag}" not in links
