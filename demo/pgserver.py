"""A private PostgreSQL server for tests and benchmarks of the PostgreSQL journal.

Debian's server binaries (``/usr/lib/postgresql/VERSION/bin``) run a throw-away cluster in a
directory named ``trellis-test-ha-*``: ``initdb`` into it (as the ``postgres`` user when we
are root, since PostgreSQL refuses to run as root), the server listening on a private port on
loopback (and on any extra addresses asked for) and on a Unix socket in the same directory,
``trust`` authentication. :meth:`PgServer.stop` stops it at once and removes the directory;
``with PgServer.started(...)`` does so whatever happens inside.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from demo.harness import shielded

BIN_GLOB = "/usr/lib/postgresql/*/bin"


class PgUnavailable(RuntimeError):
    """No PostgreSQL server can be run here (the message says why)."""


def server_bin() -> Path:
    """The newest installed server's bin directory."""
    found = sorted(Path("/").glob(BIN_GLOB.lstrip("/")),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not found or not (found[-1] / "postgres").exists():
        raise PgUnavailable("PostgreSQL's server is not installed (Debian package postgresql; "
                            "`./run test` installs it as root)")
    return found[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    listen: tuple[str, ...] = ("127.0.0.1",)
    port: int = field(default_factory=_free_port)
    root: Path | None = None
    # A command prefix for the server (e.g. ["ip", "netns", "exec", NS]: a server in a network
    # namespace of its own; its Unix socket stays reachable from everywhere).
    wrapper: list[str] = field(default_factory=list)
    _as_user: list[str] = field(default_factory=list)

    @classmethod
    @contextlib.contextmanager
    def started(cls, listen: tuple[str, ...] = ("127.0.0.1",)) -> Iterator[PgServer]:
        server = cls(listen=listen)
        try:
            server.start()
            yield server
        finally:
            server.stop()

    def _run(self, *argv: str, timeout: float = 60.0) -> str:
        done = subprocess.run([*self.wrapper, *self._as_user, *argv], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise PgUnavailable(f"{Path(argv[0]).name} failed: "
                                f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done.stdout

    def start(self) -> None:
        bindir = server_bin()
        self.root = Path(tempfile.mkdtemp(prefix="trellis-test-ha-"))
        os.chmod(self.root, 0o755)
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PgUnavailable("running as root and there is no postgres user to run "
                                    "the server as") from None
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        data = self.root / "data"
        self._run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8", "--locale=C")
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\n")
        options = (f"-k {self.root} -p {self.port} -c listen_addresses='{','.join(self.listen)}'"
                   " -c track_commit_timestamp=on -c max_connections=200"
                   " -c shared_buffers=32MB -c log_min_messages=warning")
        self._run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(self.root / "server.log"),
                  "-o", options, "-w", "-t", "60", "start", timeout=90)

    @property
    def socket_dir(self) -> Path:
        assert self.root is not None
        return self.root

    def url(self, database: str = "postgres", host: str | None = None) -> str:
        """A URL for ``database``: over the Unix socket, or TCP to ``host``."""
        if host is None:
            return f"postgresql://postgres@/{database}?host={self.socket_dir}&port={self.port}"
        return f"postgresql://postgres@{host}:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cur = conn.execute(sql)
            return "" if cur.description is None else repr(cur.fetchall())

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        name = name or f"trellis_test_{uuid.uuid4().hex[:10]}"
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log_tail(self, chars: int = 4000) -> str:
        assert self.root is not None
        try:
            return (self.root / "server.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        root, self.root = self.root, None
        if root is None:
            return
        with shielded():
            data = root / "data"
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(Exception):
                    self.root = root
                    self._run(str(server_bin() / "pg_ctl"), "-D", str(data), "-m",
                              "immediate", "-w", "stop", timeout=30)
                self.root = None
            for _ in range(50):  # the postmaster's children leave with it
                if not (data / "postmaster.pid").exists():
                    break
                time.sleep(0.1)
            shutil.rmtree(root, ignore_errors=True)
