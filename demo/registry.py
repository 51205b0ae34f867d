"""A real OCI registry on loopback and test images for it, for tests and benchmarks.

``Registry`` runs Debian's ``docker-registry`` (the CNCF distribution registry) with its own
config and storage in a ``trellis-test-`` temporary directory on a free loopback port, and
stops it (and removes the directory) on ``close``. ``build_image`` writes an OCI image layout
whose root file system is ``busybox-static`` (its applets as symlinks) plus optional padding,
and ``Registry.push`` copies it there with ``skopeo``: no network, nothing from a public
registry.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BUSYBOX = "/bin/busybox"
# The applets a test job uses, linked to busybox in the image's /bin.
APPLETS = ("sh", "cat", "echo", "sleep", "id", "ls", "dd", "head", "touch", "mkdir", "test",
           "true", "false", "kill", "grep", "env", "tail", "wc", "rm", "stat", "readlink")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def _add(tar: tarfile.TarFile, name: str, *, kind: bytes = tarfile.DIRTYPE, mode: int = 0o755,
         data: bytes = b"", link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, 0
    if kind == tarfile.SYMTYPE:
        info.linkname = link
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def build_image(layout: Path, tag: str = "latest", *, pad_mb: int = 0,
                arch: str = "amd64", seed: int = 0) -> None:
    """Write (or add ``tag`` to) an OCI image layout at ``layout``: busybox, a /tmp and /etc
    passwd, plus ``pad_mb`` MiB of incompressible padding in /pad (a large image for pull
    measurements); ``arch`` is what its config declares (a foreign one for bad-input tests)."""
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for d in ("bin", "etc", "tmp", "dev", "proc", "sys", "scratch"):
            _add(tar, d, mode=0o1777 if d in ("tmp", "scratch") else 0o755)
        _add(tar, "bin/busybox", kind=tarfile.REGTYPE, data=Path(BUSYBOX).read_bytes())
        for applet in APPLETS:
            _add(tar, f"bin/{applet}", kind=tarfile.SYMTYPE, link="busybox")
        _add(tar, "etc/passwd", kind=tarfile.REGTYPE, mode=0o644,
             data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
        _add(tar, "etc/seed", kind=tarfile.REGTYPE, mode=0o644, data=f"{seed}\n".encode())
        if pad_mb:
            _add(tar, "pad", kind=tarfile.REGTYPE, mode=0o644,
                 data=os.urandom(pad_mb << 20))
    diff = raw.getvalue()
    layer, layer_size = _blob(layout, gzip.compress(diff, compresslevel=1))
    config = {
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(diff).hexdigest()}"]},
    }
    cfg, cfg_size = _blob(layout, json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": cfg, "size": cfg_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer, "size": layer_size}],
    }
    man, man_size = _blob(layout, json.dumps(manifest).encode())
    index_path = layout / "index.json"
    index = (json.loads(index_path.read_text()) if index_path.exists()
             else {"schemaVersion": 2, "manifests": []})
    index["manifests"] = [m for m in index["manifests"]
                          if m.get("annotations", {}).get("org.opencontainers.image.ref.name")
                          != tag]
    index["manifests"].append({
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man,
        "size": man_size, "annotations": {"org.opencontainers.image.ref.name": tag}})
    index_path.write_text(json.dumps(index))


@dataclass
class Registry:
    """Debian's docker-registry on loopback (or ``address``), storage and config in its own
    temp dir."""

    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="trellis-test-reg-")))
    port: int = field(default_factory=free_port)
    htpasswd: str = ""  # an htpasswd line (user:bcrypt): the registry asks for credentials
    proc: subprocess.Popen[bytes] | None = None
    # Where it listens: loopback, or a test network's address (nodes in network namespaces
    # of their own reach it there, demo/netlab.py).
    address: str = "127.0.0.1"

    @property
    def host(self) -> str:
        return f"{self.address}:{self.port}"

    def start(self, timeout: float = 20.0) -> Registry:
        config = {
            "version": 0.1, "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.dir / "storage")},
                        "delete": {"enabled": True}},
            "http": {"addr": self.host},
        }
        if self.htpasswd:
            (self.dir / "htpasswd").write_text(self.htpasswd + "\n")
            config["auth"] = {"htpasswd": {"realm": "trellis-test",
                                           "path": str(self.dir / "htpasswd")}}
        (self.dir / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        with open(self.dir / "registry.log", "wb") as out:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                ["docker-registry", "serve", str(self.dir / "config.yml")],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1).close()
                return self
            except urllib.error.HTTPError:
                return self  # 401: up, asking for credentials
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "registry.log").read_text(errors="replace")[-2000:]
                    self.close()
                    raise RuntimeError(f"docker-registry did not start: {log}") from None
                time.sleep(0.05)

    def push(self, layout: Path, tag: str, name: str, creds: str = "") -> str:
        """Copy ``layout:tag`` to ``HOST/name:tag``; returns that reference."""
        ref = f"{self.host}/{name}:{tag}"
        cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
               f"oci:{layout}:{tag}", f"docker://{ref}"]
        if creds:
            cmd[2:2] = ["--dest-creds", creds]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        return ref

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def layer_bytes(layout: Path, tag: str) -> int:
    """The compressed size of ``tag``'s layers: what a pull of it transfers."""
    index = json.loads((layout / "index.json").read_text())
    entry = next(m for m in index["manifests"]
                 if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    digest = entry["digest"].split(":", 1)[1]
    manifest = json.loads((layout / "blobs" / "sha256" / digest).read_bytes())
    return sum(int(layer["size"]) for layer in manifest["layers"])


class BrokenRegistry:
    """A loopback port that is not a registry: ``garbage`` answers every request with an
    HTML page, ``hang`` accepts connections and never answers. For pull-failure tests."""

    def __init__(self, mode: str) -> None:
        assert mode in ("garbage", "hang")
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.host = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self._open.append(conn)
            if self.mode == "garbage":
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 20\r\n\r\n<html>garbage</html>")
                except OSError:
                    pass
                conn.close()

    def __enter__(self) -> BrokenRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for conn in self._open:
            conn.close()
        self._thread.join(5)
