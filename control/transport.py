"""One HTTP/1.1 POST over a socket: the synchronous client's transport.

Why not ``urllib``: ``urllib.request`` and ``http.client`` import ``ssl``, ``email`` and
more, which cost ``trellisctl`` more start-up time than everything else a ``trellisctl jobs``
needs together (the CLI is run in shell loops, as ``sbatch`` is). The master answers every
request with a plain HTTP/1.1 response carrying ``Content-Length``; a POST, the status line,
the headers and the body (length-delimited, chunked, or read to the close) is all this needs.
``ssl`` is imported only for an ``https`` URL.

Errors: :class:`OSError` (refused, reset, timed out, TLS handshake failed) when the master
cannot be talked to, :class:`HttpError` when what came back is not an HTTP response, and
:class:`BadUrl` for a URL this client cannot use.
"""

from __future__ import annotations

import socket
import time

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl

MAX_HEAD = 64 << 10  # status line and headers
_READ = 1 << 16


class BadUrl(ValueError):
    """The URL is not ``http://HOST[:PORT][/PATH]`` or ``https://...``."""


class HttpError(Exception):
    """The peer answered, but not with an HTTP/1.x response this client can read."""


# Plain classes, not named tuples: ``typing`` is not on this start-up path.
class Url:
    __slots__ = ("host", "path", "port", "scheme")

    def __init__(self, scheme: str, host: str, port: int, path: str) -> None:
        self.scheme = scheme
        self.host = host
        self.port = port
        self.path = path

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Url) and (self.scheme, self.host, self.port, self.path) == (
            other.scheme, other.host, other.port, other.path)

    def __repr__(self) -> str:
        return f"Url({self.scheme!r}, {self.host!r}, {self.port}, {self.path!r})"


class Reply:
    __slots__ = ("body", "status")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body


def split_url(url: str) -> Url:
    """``http://host:port/path`` into its parts (an IPv6 host in brackets)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise BadUrl(f"master URL {url!r} must start with http:// or https://")
    authority, slash, path = rest.partition("/")
    path = "/" + path if slash else "/"
    if "@" in authority or any(c in authority for c in "?# \t"):
        raise BadUrl(f"master URL {url!r}: expected http(s)://HOST[:PORT][/PATH]")
    if authority.startswith("["):
        host, bracket, tail = authority[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise BadUrl(f"master URL {url!r}: an IPv6 address goes in [brackets]")
        port_text = tail[1:]
    else:
        host, _, port_text = authority.partition(":")
    if not host:
        raise BadUrl(f"master URL {url!r} names no host")
    port = 443 if scheme == "https" else 80
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise BadUrl(f"master URL {url!r}: port {port_text!r} is not 1-65535")
        port = int(port_text)
    return Url(scheme, host, port, path)


def post(url: Url, path: str, body: bytes, headers: dict[str, str], timeout: float,
         ssl_context: ssl.SSLContext | None = None, max_body: int = 256 << 20) -> Reply:
    """POST ``body`` to ``url.path`` joined with ``path``; the whole exchange (connect, TLS,
    send, receive) must finish within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    target = url.path.rstrip("/") + path
    head = [f"POST {target} HTTP/1.1", f"Host: {url.authority}",
            f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
    # An ASCII host as bytes: getaddrinfo would otherwise load the IDNA codec to encode it.
    host: str | bytes = url.host.encode() if url.host.isascii() else url.host
    sock = socket.create_connection((host, url.port), timeout=timeout)
    try:
        if url.scheme == "https":
            if ssl_context is None:
                import ssl

                ssl_context = ssl.create_default_context()
            sock = ssl_context.wrap_socket(sock, server_hostname=url.host)
        _remaining(sock, deadline)
        sock.sendall(request)
        return _Reader(sock, deadline).reply(max_body)
    finally:
        sock.close()


def _remaining(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)


class _Reader:
    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""
        self.eof = False

    def _more(self) -> bool:
        if self.eof:
            return False
        _remaining(self.sock, self.deadline)
        data = self.sock.recv(_READ)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _fill(self, n: int) -> None:
        """Receive until ``n`` bytes are buffered, straight into one buffer of that size: a
        large body (a chunk of ``trellisctl logs``) grown by ``bytes +=`` per receive was
        copied over and over."""
        body = bytearray(n)
        view = memoryview(body)
        have = len(self.buf)
        view[:have] = self.buf
        while have < n and not self.eof:
            _remaining(self.sock, self.deadline)
            got = self.sock.recv_into(view[have:])
            if not got:
                self.eof = True
            have += got
        self.buf = bytes(view[:have])

    def _line(self, limit: int) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > limit or not self._more():
                raise HttpError("the reply ended in the middle of a line")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exactly(self, n: int) -> bytes:
        if n - len(self.buf) > _READ:
            self._fill(n)
        while len(self.buf) < n:
            if not self._more():
                raise HttpError(f"the reply ended after {len(self.buf)} of {n} body bytes")
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise HttpError(f"the reply's headers exceed {MAX_HEAD} bytes")
            if not self._more():
                if not self.buf:
                    raise HttpError("the connection closed without a reply")
                raise HttpError("the reply ended inside its headers")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP reply: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise HttpError(f"malformed header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    def reply(self, max_body: int) -> Reply:
        status, headers = self._head()
        while 100 <= status < 200:  # interim answers (100 Continue) precede the real one
            status, headers = self._head()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return Reply(status, self._chunked(max_body))
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise HttpError(f"bad Content-Length {length[:40]!r}")
            if int(length) > max_body:
                raise HttpError(f"the reply is {length} bytes, over the {max_body}-byte limit")
            return Reply(status, self._exactly(int(length)))
        while self._more():  # no length: the body runs to the close
            if len(self.buf) > max_body:
                raise HttpError(f"the reply exceeds the {max_body}-byte limit")
        return Reply(status, self.buf)

    def _chunked(self, max_body: int) -> bytes:
        out = bytearray()
        while True:
            size_text = self._line(1024).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                while self._line(MAX_HEAD):  # trailers, up to the empty line
                    pass
                return bytes(out)
            if len(out) + size > max_body:
                raise HttpError(f"the reply exceeds the {max_body}-byte limit")
            out += self._exactly(size)
            if self._exactly(2) != b"\r\n":
                raise HttpError("a chunk is not followed by CRLF")
