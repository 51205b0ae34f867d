"""Authentication and authorisation against real daemons: tokens, roles, node identity, TLS."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from control.client import MasterClient, RpcError, Unreachable
from demo.cluster import LocalCluster, default_job_user, free_port
from shared.auth import Secret, client_ssl_context
from shared.model import GpuInfo, NodeInventory
from shared.protocol import encode_frame, encode_rpc_request
from shared.schema import encode

ROOT = Path(__file__).resolve().parents[2]
USER = default_job_user()


def ctl(cluster: LocalCluster, *args: str, env: dict[str, str] | None = None
        ) -> tuple[int, Any, str, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRELLIS_")}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "control.cli", "--master", cluster.url, "-o", "json", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=full_env)
    out = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None
    return proc.returncode, out, proc.stdout, proc.stderr


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    root = tmp_path_factory.mktemp(prefix)
    os.chmod(root, 0o755)
    cluster = LocalCluster(root, nodes=1, gpus_per_node=2, prefix=prefix, auth=True,
                           extra_master={"clients_may_submit": True})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def call(cluster: LocalCluster, role: str | None, method: str,
         params: dict[str, Any] | None = None) -> Any:
    token = Secret(cluster.tokens[role]) if role else None
    return MasterClient(cluster.url, timeout=10, token=token).call(method, params)


def test_requests_without_valid_credentials_are_refused(secured: LocalCluster) -> None:
    for token in (None, "x" * 40, secured.tokens["admin"] + "x"):
        client = MasterClient(secured.url, timeout=10,
                              token=Secret(token) if token else None)
        with pytest.raises(RpcError) as err:
            client.call("ping")
        assert err.value.code == "unauthenticated"
        assert "Bearer" in err.value.message
    assert call(secured, "admin", "ping")["version"]


def test_roles_limit_what_each_credential_may_do(secured: LocalCluster) -> None:
    node = secured.node_name(1)
    assert call(secured, "client", "ping")["version"]
    assert any(n["name"] == node for n in call(secured, "client", "nodes")["nodes"])
    for method, params in (("drain", {"node": node}), ("undrain", {"node": node})):
        with pytest.raises(RpcError) as err:
            call(secured, "client", method, params)
        assert err.value.code == "forbidden" and "admin-only" in err.value.message
        with pytest.raises(RpcError) as err:
            call(secured, node, method, params)
        assert err.value.code == "forbidden"
    assert call(secured, "admin", "drain", {"node": node})["status"] == "drained"
    try:
        # A client submits as its own Unix user only, and cancels only its own jobs.
        own = call(secured, "client", "submit", {"job": {
            "name": "mine", "command": ["true"], "user": USER, "kind": "cpu"}})["job"]["id"]
        with pytest.raises(RpcError) as err:
            call(secured, "client", "submit", {"job": {
                "name": "theirs", "command": ["true"], "user": "daemon", "kind": "cpu"}})
        assert err.value.code == "forbidden" and "only as Unix user" in err.value.message
        other = call(secured, "admin", "submit", {"job": {
            "name": "admins", "command": ["true"], "user": "daemon",
            "kind": "cpu"}})["job"]["id"]
        with pytest.raises(RpcError) as err:
            call(secured, "client", "cancel", {"id": other})
        assert err.value.code == "forbidden" and "belongs to 'daemon'" in err.value.message
        assert call(secured, "client", "cancel", {"id": own})["job"]["state"] == "cancelled"
        assert call(secured, "admin", "cancel", {"id": other})["job"]["state"] == "cancelled"
    finally:
        call(secured, "admin", "undrain", {"node": node})


def test_trellisctl_reads_its_token_file_and_never_prints_it(secured: LocalCluster,
                                                             tmp_path: Path) -> None:
    admin_file = secured.token_file("admin")
    code, out, stdout, stderr = ctl(secured, "nodes",
                                    env={"TRELLIS_TOKEN_FILE": str(admin_file)})
    assert code == 0, stderr
    assert out["nodes"][0]["status"] == "ready"
    code, _, stdout, stderr = ctl(secured, "nodes")
    assert code == 1 and "unauthenticated" in stderr
    client_file = secured.token_file("client")
    code, _, stdout, stderr = ctl(secured, "--token-file", str(client_file), "drain",
                                  secured.node_name(1))
    assert code == 1 and "forbidden" in stderr and "admin-only" in stderr
    # A token file others can read is refused before anything is sent, naming the file only.
    loose = tmp_path / "loose.token"
    loose.write_text(secured.tokens["admin"] + "\n")
    os.chmod(loose, 0o644)
    code, _, stdout, stderr = ctl(secured, "nodes", env={"TRELLIS_TOKEN_FILE": str(loose)})
    assert code == 2 and "chmod 600" in stderr and str(loose) in stderr
    for text in (stdout, stderr):
        for token in secured.tokens.values():
            assert token not in text


async def _node_session(url: str, token: str, frames: list[bytes], wait: float = 3.0
                        ) -> list[dict]:
    replies: list[dict] = []
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as s, s.ws_connect(url + "/v1/node",
                                                          headers=headers) as ws:
        for frame in frames:
            await ws.send_bytes(frame)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                msg = await ws.receive(timeout=deadline - time.monotonic())
                if msg.type != aiohttp.WSMsgType.BINARY:
                    return replies
                data = msgpack.unpackb(msg.data)
                if data["type"] in ("ack", "error"):
                    replies.append(data)
                    break
    return replies


def _inventory(name: str) -> dict:
    return encode(NodeInventory(
        name=name, hostname="fake", address="127.0.0.1", memory_mib=1024,
        gpus=(GpuInfo(index=0, uuid=f"GPU-{name}", model="A100-SXM4-40GB",
                      memory_mib=40960),)))


def test_a_node_speaks_only_for_itself(secured: LocalCluster) -> None:
    real = secured.node_name(1)
    fake = secured.node_name(2)  # has a token of its own, but no daemon
    admin = secured.client()
    job = admin.call("submit", {"job": {"name": "victim", "command": ["sleep", "60"],
                                        "user": USER, "gpus": 1}})["job"]["id"]
    try:
        wait_for(lambda: admin.call("job", {"id": job})["job"]["state"] == "running",
                 what="the job to run")
        # Node 2's credential cannot register as node 1 ...
        replies = asyncio.run(_node_session(secured.url, secured.tokens[fake], [
            encode_frame("hello", 1, {"inventory": _inventory(real)})]))
        assert replies[0]["type"] == "error"
        assert replies[0]["body"]["code"] == "forbidden"
        assert f"cannot register as {real!r}" in replies[0]["body"]["message"]
        # ... and, registered as itself, cannot report node 1's job.
        replies = asyncio.run(_node_session(secured.url, secured.tokens[fake], [
            encode_frame("hello", 1, {"inventory": _inventory(fake)}),
            encode_frame("job_exited", 3, {"job_id": job, "exit_code": 0}),
            encode_frame("job_started", 5, {"job_id": job, "pid": 1}),
        ]))
        assert [r["type"] for r in replies] == ["ack", "error", "error"]
        assert all(r["body"]["code"] == "forbidden" for r in replies[1:])
        assert "may report only its own jobs" in replies[1]["body"]["message"]
        assert admin.call("job", {"id": job})["job"]["state"] == "running"
        # Admin and client credentials cannot open a node session at all.
        for role in ("admin", "client"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                asyncio.run(_node_session(secured.url, secured.tokens[role], []))
            assert err.value.status == 403
    finally:
        admin.call("cancel", {"id": job})


def test_secrets_never_reach_the_logs(secured: LocalCluster) -> None:
    # Failed attempts with real tokens in the wrong place are logged; the tokens are not.
    for role in ("admin", "client"):
        with pytest.raises(aiohttp.WSServerHandshakeError):
            asyncio.run(_node_session(secured.url, secured.tokens[role], []))
    with pytest.raises(RpcError):
        MasterClient(secured.url, token=Secret(secured.tokens["admin"][:-1] + "?")).call("ping")
    logs = "".join(p.read_text(errors="replace") for p in secured.root.glob("*.log"))
    assert "refused unauthenticated" in logs
    for token in secured.tokens.values():
        assert token not in logs
        assert token[:12] not in logs


def _start(argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_daemons_refuse_token_files_others_can_read(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    token.write_text("t" * 32 + "\n")
    os.chmod(token, 0o640)
    cfg = tmp_path / "m.toml"
    cfg.write_text(f'[master]\nlisten_port = {free_port()}\nstate_dir = "{tmp_path}/st"\n'
                   f'admin_token_file = "{token}"\n')
    proc = _start(["masterd.main", "-c", str(cfg)])
    assert proc.returncode == 2
    assert f"admin token file {token} has mode 0640" in proc.stderr
    assert "chmod 600" in proc.stderr and "t" * 32 not in proc.stderr
    ncfg = tmp_path / "n.toml"
    ncfg.write_text(f'[node]\nname = "trellis-test-n"\nstate_dir = "{tmp_path}/n"\n'
                    f'cgroup_mode = "affinity"\ntoken_file = "{token}"\n'
                    f'master_url = "http://127.0.0.1:9"\n')
    proc = _start(["noded.main", "-c", str(ncfg)])
    assert proc.returncode == 1 and "node token file" in proc.stderr
    assert "has mode 0640" in proc.stderr and "t" * 32 not in proc.stderr


def test_master_without_auth_refuses_non_loopback(tmp_path: Path) -> None:
    cfg = tmp_path / "m.toml"
    cfg.write_text(f'[master]\nlisten_host = "0.0.0.0"\nlisten_port = {free_port()}\n'
                   f'state_dir = "{tmp_path}/st"\n')
    proc = _start(["masterd.main", "-c", str(cfg)])
    assert proc.returncode == 2
    assert "no authentication is configured" in proc.stderr
    assert "refuses to listen on 0.0.0.0" in proc.stderr


def test_open_loopback_master_warns_loudly(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", nodes=0, prefix="trellis-test-open")
    try:
        cluster.start_master()
        assert cluster.client().call("ping")
    finally:
        cluster.close()
    assert "NO AUTHENTICATION CONFIGURED" in cluster.log("master")


# -- mutual TLS -------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d: Path, clients: dict[str, tuple[str, str]]) -> None:
    """A CA, a server certificate for 127.0.0.1 and client certificates {file: (CN, OU)}."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj",
             "/CN=trellis-test-ca", cwd=d)
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for name, subj in [("server", "/CN=127.0.0.1")] + [
            (f, f"/OU={ou}/CN={cn}") for f, (cn, ou) in clients.items()]:
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
        extra = ["-extfile", str(ext)] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extra, cwd=d)
        os.chmod(d / f"{name}.key", 0o600)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_mutual_tls_gives_roles_from_certificates(tmp_path: Path) -> None:
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    pki = tmp_path / "pki"
    pki.mkdir()
    node = f"{prefix}-n1"
    make_pki(pki, {"admin": ("alice", "admin"), "client": (USER, "client"),
                   "node": (node, "node"), "stranger": ("bob", "sales")})
    admin_ssl = client_ssl_context(str(pki / "ca.pem"), str(pki / "admin.pem"),
                                   str(pki / "admin.key"))
    cluster = LocalCluster(
        tmp_path / "c", nodes=1, gpus_per_node=1, prefix=prefix, scheme="https",
        client_ssl=admin_ssl,
        extra_master={"tls_cert_file": str(pki / "server.pem"),
                      "tls_key_file": str(pki / "server.key"),
                      "tls_ca_file": str(pki / "ca.pem")},
        node_settings={"tls_ca_file": str(pki / "ca.pem"), "tls_cert_file": str(pki / "node.pem"),
                    "tls_key_file": str(pki / "node.key")})
    try:
        cluster.start()  # the node registers over TLS with its certificate
        assert cluster.client().call("drain", {"node": node})["status"] == "drained"

        def client(cert: str | None) -> MasterClient:
            ctx = client_ssl_context(str(pki / "ca.pem"), str(pki / f"{cert}.pem") if cert
                                     else None, str(pki / f"{cert}.key") if cert else None)
            return MasterClient(cluster.url, timeout=10, ssl_context=ctx)

        assert client("client").call("ping")["version"]
        with pytest.raises(RpcError) as err:
            client("client").call("undrain", {"node": node})
        assert err.value.code == "forbidden"
        with pytest.raises(RpcError) as err:
            client("stranger").call("ping")
        assert err.value.code == "unauthenticated"
        with pytest.raises(Unreachable):  # no certificate: the handshake fails
            client(None).call("ping")
        with pytest.raises(Unreachable):  # plain HTTP to a TLS socket
            MasterClient(cluster.url.replace("https:", "http:"), timeout=5).call("ping")
        code, out, _, stderr = ctl(cluster, "--ca-file", str(pki / "ca.pem"), "--cert-file",
                                   str(pki / "admin.pem"), "--key-file", str(pki / "admin.key"),
                                   "undrain", node)
        assert code == 0 and out["status"] == "ready", stderr
        # The node's certificate is for the node channel only.
        with pytest.raises(RpcError) as err:
            client("node").call("jobs")
        assert err.value.code == "forbidden"
    finally:
        cluster.close()


def test_rpc_on_node_endpoint_without_upgrade_is_not_a_crash(secured: LocalCluster) -> None:
    async def go() -> int:
        async with aiohttp.ClientSession() as s, s.post(
                secured.url + "/v1/node", data=encode_rpc_request("ping", {}),
                headers={"Authorization": f"Bearer {secured.tokens['admin']}"}) as r:
            return r.status

    assert asyncio.run(go()) in (403, 405)


def test_unknown_endpoints_need_credentials_and_answer_with_a_coded_error(
        secured: LocalCluster) -> None:
    """Paths and methods no route serves go through authentication like every route, then
    get a msgpack error naming what is served instead."""

    async def go(method: str, path: str, token: str | None) -> tuple[int, dict, str | None]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as s, s.request(
                method, secured.url + path, headers=headers) as r:
            return r.status, msgpack.unpackb(await r.read()), r.headers.get("Allow")

    admin = secured.tokens["admin"]
    status, body, _ = asyncio.run(go("GET", "/v2/nothing", None))
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    status, body, _ = asyncio.run(go("GET", "/v2/nothing", admin))
    assert status == 404 and body["error"]["code"] == "not_found"
    assert "/v2/nothing" in body["error"]["message"]
    status, body, allow = asyncio.run(go("GET", "/v1/rpc", admin))
    assert status == 405 and body["error"]["code"] == "method_not_allowed" and allow == "POST"
    status, body, allow = asyncio.run(go("DELETE", "/metrics", admin))
    assert status == 405 and allow == "GET"
    # The master still serves the real endpoints afterwards.
    assert call(secured, "admin", "ping")["version"]


def test_metrics_without_credentials_is_refused_in_text(secured: LocalCluster) -> None:
    """curl or Prometheus without a token read a sentence, not a msgpack body."""

    async def go(token: str | None) -> tuple[int, str, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as s, s.get(secured.url + "/metrics",
                                                       headers=headers) as r:
            return r.status, r.headers.get("Content-Type", ""), await r.text()

    status, kind, text = asyncio.run(go(None))
    assert status == 401 and kind.startswith("text/plain"), (status, kind)
    assert text.startswith("unauthenticated: missing or invalid credentials"), text
    status, kind, text = asyncio.run(go(secured.tokens["admin"]))
    assert status == 200 and "trellis_queue_length" in text
