"""Authentication material shared by the master, the node daemon and trellisctl.

Two ways to prove who you are, usable together:

* **Bearer tokens** read from files that only their owner (root, or the user running the
  program) may read. A master token file holds one entry per line, ``NAME TOKEN`` or just
  ``TOKEN``; the name is the identity (a node's name, a client's Unix user). A client-side token
  file (noded, trellisctl) holds the token alone. Tokens are compared in constant time and never
  appear in logs, errors or output: :class:`Secret` hides them from ``repr``/``str``.
* **Mutual TLS**: the master's server context asks for a client certificate signed by the
  configured CA; the role comes from the certificate's OU (``admin``, ``client``, ``node``) or,
  failing that, from configured CN lists; the identity is the CN.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import ssl
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("admin", "client", "node")
MIN_TOKEN_LEN = 16
MAX_TOKEN_LEN = 4096
# Visible ASCII without spaces: a token must travel in an HTTP header untouched.
_TOKEN_RE = re.compile(r"[\x21-\x7e]+")
_IDENTITY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}")


class AuthError(ValueError):
    """Authentication material cannot be used; the message names the file, never a secret."""


class Secret:
    """A token that cannot leak through ``repr``, ``str``, f-strings or logging."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(****)"

    __str__ = __repr__

    def __reduce__(self) -> Any:  # never pickled into another process's memory by accident
        raise TypeError("a Secret cannot be pickled")


@dataclass(frozen=True)
class Principal:
    """Who is on the other end of a connection."""

    role: str  # admin | client | node
    name: str  # node name, client user, or the admin's name
    via: str  # token | tls | open

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


# -- token files ------------------------------------------------------------------------------


def check_private(path: Path, what: str) -> os.stat_result:
    """Refuse a secret file that others could read or change, with a sentence saying why."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise AuthError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise AuthError(f"{what} {path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise AuthError(f"{what} {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise AuthError(
            f"{what} {path} has mode {mode:04o}: it must not be readable or writable by its "
            f"group or others (run: chmod 600 {path})")
    if st.st_uid not in (0, os.geteuid()):
        raise AuthError(f"{what} {path} is owned by uid {st.st_uid}: it must belong to root "
                        "or to the user running this program")
    return st


def _check_token(token: str, where: str) -> Secret:
    if not _TOKEN_RE.fullmatch(token):
        raise AuthError(f"{where}: a token must be visible ASCII characters without spaces")
    if not MIN_TOKEN_LEN <= len(token) <= MAX_TOKEN_LEN:
        raise AuthError(f"{where}: a token must be {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} "
                        f"characters long (this one has {len(token)})")
    return Secret(token)


def _lines(path: Path, what: str) -> list[tuple[int, str]]:
    check_private(path, what)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthError(f"{what} {path} cannot be read: {exc}") from None
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append((number, line))
    return out


def read_token(path: str | Path, what: str = "token file") -> Secret:
    """The single token of a client-side token file (noded, trellisctl)."""
    path = Path(path)
    lines = _lines(path, what)
    if len(lines) != 1:
        raise AuthError(f"{what} {path} must hold exactly one token line "
                        f"(found {len(lines)})")
    number, line = lines[0]
    return _check_token(line, f"{what} {path} line {number}")


def read_token_table(path: str | Path, role: str, *, named: bool) -> dict[bytes, str]:
    """Entries of a master token file as {sha256(token): identity}.

    ``named`` requires ``NAME TOKEN`` lines (nodes must be told apart); otherwise a bare
    ``TOKEN`` gets the role's name as identity.
    """
    path = Path(path)
    what = f"{role} token file"
    table: dict[bytes, str] = {}
    for number, line in _lines(path, what):
        where = f"{what} {path} line {number}"
        parts = line.split()
        if len(parts) == 1 and not named:
            name, token = role, parts[0]
        elif len(parts) == 2:
            name, token = parts
        else:
            expected = "NAME TOKEN" if named else "TOKEN or NAME TOKEN"
            raise AuthError(f"{where}: expected {expected}")
        if not _IDENTITY_RE.fullmatch(name):
            raise AuthError(f"{where}: {name!r} is not a valid identity name")
        secret = _check_token(token, where)
        digest = _digest(secret.reveal())
        if digest in table:
            raise AuthError(f"{where}: the same token appears twice")
        table[digest] = name
    if not table:
        raise AuthError(f"{what} {path} holds no token")
    return table


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


# -- TLS --------------------------------------------------------------------------------------


def server_ssl_context(cert: str, key: str, ca: str | None, *, require_cert: bool
                       ) -> ssl.SSLContext:
    """TLS for the master's listening socket; with ``ca`` set, client certificates are
    verified against it (required when no token can stand in for them)."""
    check_private(Path(key), "TLS private key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if ca:
            ctx.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise AuthError(f"cannot load the TLS certificate/key/CA ({cert}, {key}, {ca}): "
                        f"{exc}") from None
    if ca:
        ctx.verify_mode = ssl.CERT_REQUIRED if require_cert else ssl.CERT_OPTIONAL
    return ctx


def client_ssl_context(ca: str | None, cert: str | None = None, key: str | None = None
                       ) -> ssl.SSLContext:
    """TLS for noded/trellisctl dialling the master: verify it against ``ca`` (else the system
    store) and present a client certificate when one is configured."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert:
        if not key:
            raise AuthError("a TLS client certificate needs its private key file too")
        check_private(Path(key), "TLS private key")
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise AuthError(f"cannot load the TLS client certificate {cert}: {exc}") from None
    return ctx


def cert_fields(peercert: dict[str, Any] | None) -> tuple[str | None, set[str]]:
    """(CN, {OU, ...}) of a certificate as ``SSLObject.getpeercert()`` returns it."""
    if not peercert:
        return None, set()
    cn, ous = None, set()
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                cn = value
            elif key == "organizationalUnitName":
                ous.add(value)
    return cn, ous


# -- the master's view ------------------------------------------------------------------------


_OPEN = Principal("admin", "local", "open")  # immutable: one for every open request


@dataclass
class Authenticator:
    """Maps what a connection presents (a bearer token, a client certificate) to a Principal."""

    tokens: dict[str, dict[bytes, str]] = field(default_factory=dict)  # role -> table
    tls_clients: bool = False  # client certificates are verified
    cert_cns: dict[str, frozenset[str]] = field(default_factory=dict)  # role -> CNs
    open_access: bool = False  # no auth configured (loopback only)

    @property
    def enabled(self) -> bool:
        return bool(self.tokens) or self.tls_clients

    def from_token(self, token: str) -> Principal | None:
        """Constant-time lookup: every entry is compared, whichever matches."""
        if not token or len(token) > MAX_TOKEN_LEN:
            return None
        digest = _digest(token)
        found: Principal | None = None
        for role in ROLES:
            for stored, name in self.tokens.get(role, {}).items():
                if hmac.compare_digest(stored, digest):
                    found = Principal(role, name, "token")
        return found

    def from_cert(self, peercert: dict[str, Any] | None) -> Principal | None:
        if not self.tls_clients:
            return None
        cn, ous = cert_fields(peercert)
        if not cn or not _IDENTITY_RE.fullmatch(cn):
            return None
        roles = [r for r in ROLES if r in ous]
        if len(roles) == 1:
            return Principal(roles[0], cn, "tls")
        for role in ROLES:
            if cn in self.cert_cns.get(role, frozenset()):
                return Principal(role, cn, "tls")
        return None

    def authenticate(self, authorization: str | None, peercert: dict[str, Any] | None
                     ) -> Principal | None:
        if self.open_access:
            return _OPEN
        principal = self.from_cert(peercert)
        if principal is not None:
            return principal
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() == "bearer":
                return self.from_token(token.strip())
        return None


def bearer_header(token: Secret | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.reveal()}"} if token is not None else {}


def is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def all_loopback(hosts: Iterable[str]) -> bool:
    return all(is_loopback(h) for h in hosts)
