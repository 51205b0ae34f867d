"""Who may talk to the master, and what each role may do.

Every HTTP request and every node WebSocket is authenticated in :func:`auth_middleware`
(bearer token or client certificate) and carries its :class:`Principal` in
``request[PRINCIPAL_KEY]``. RPC methods are then authorised by role in :func:`authorize_rpc`;
node sessions are bound to the node name the credential names (:func:`check_node_identity`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from shared.auth import (
    Authenticator,
    AuthError,
    Principal,
    is_loopback,
    read_token_table,
    server_ssl_context,
)
from shared.config import MasterConfig
from shared.protocol import ProtocolError, encode_rpc_error

log = logging.getLogger("trellis.master.auth")

PRINCIPAL_KEY = web.RequestKey("principal", Principal)
# Reachable without credentials: liveness probes carry none and learn nothing from it.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})

# Methods each non-admin role may call; admins may call everything. A method missing here is
# admin-only, so a new operator-level RPC is protected until someone decides otherwise.
CLIENT_METHODS = frozenset({"ping", "submit", "submit_many", "cancel", "jobs", "job", "nodes",
                            "place", "placement", "release", "report_load", "services",
                            # Their own jobs only (masterd.features.holds checks the owner).
                            "hold", "update", "logs",
                            # GET /v1/relay: their own jobs' terminals and ports.
                            "relay",
                            # Their own accounts only (masterd.api.accounts filters them).
                            "account_list", "account_show",
                            # Filtered to their accounts' rows and their own jobs
                            # (masterd.api.fairshare), as sshare and sreport are for users.
                            "share", "report",
                            # Names, nodes and limits: what --partition is chosen by.
                            "partitions", "priority_classes", "maintenance_list",
                            "reservation_list",
                            # One job's events, of a job the client may see (masterd.api.rpc).
                            "events"})
NODE_METHODS = frozenset({"ping"})


def build_authenticator(config: MasterConfig) -> Authenticator:
    """Read the token files and TLS settings; refuse configurations that would be unsafe."""
    tokens: dict[str, dict[bytes, str]] = {}
    for role, path, named in (("admin", config.admin_token_file, False),
                              ("client", config.client_token_file, True),
                              ("node", config.node_token_file, True)):
        if path:
            tokens[role] = read_token_table(path, role, named=named)
    seen: dict[bytes, str] = {}
    for role, table in tokens.items():
        for digest in table:
            if digest in seen:
                raise AuthError(f"the same token is configured for roles {seen[digest]} and "
                                f"{role}; give every role its own")
            seen[digest] = role
    auth = Authenticator(
        tokens=tokens,
        tls_clients=bool(config.tls_ca_file),
        cert_cns={"admin": frozenset(config.tls_admin_cns),
                  "client": frozenset(config.tls_client_cns),
                  "node": frozenset(config.tls_node_cns)},
    )
    if not auth.enabled:
        if not is_loopback(config.listen_host):
            raise AuthError(
                f"no authentication is configured, so the master refuses to listen on "
                f"{config.listen_host}: set admin_token_file/node_token_file/"
                "client_token_file or tls_ca_file, or listen on 127.0.0.1")
        auth.open_access = True
    return auth


def build_ssl(config: MasterConfig) -> ssl.SSLContext | None:
    if not (config.tls_cert_file or config.tls_key_file):
        if config.tls_ca_file:
            raise AuthError("tls_ca_file needs tls_cert_file and tls_key_file: client "
                            "certificates are only asked for over TLS")
        return None
    if not (config.tls_cert_file and config.tls_key_file):
        raise AuthError("TLS needs both tls_cert_file and tls_key_file")
    has_tokens = any((config.admin_token_file, config.client_token_file,
                      config.node_token_file))
    return server_ssl_context(config.tls_cert_file, config.tls_key_file,
                              config.tls_ca_file or None, require_cert=not has_tokens)


def warn_if_open(auth: Authenticator, config: MasterConfig) -> None:
    if auth.open_access:
        banner = "!" * 72
        log.warning(banner)
        log.warning("NO AUTHENTICATION CONFIGURED: anyone who can connect to %s:%d is an "
                    "admin. Serving loopback only. Configure token files or mutual TLS "
                    "(docs/security.md) before exposing the master.", config.listen_host,
                    config.listen_port)
        log.warning(banner)
    else:
        log.info("auth tokens=%s mtls=%s", ",".join(sorted(auth.tokens)) or "none",
                 auth.tls_clients)


# Paths read by tools that speak text (Prometheus, curl): a refusal there is text too.
TEXT_PATHS = frozenset({"/metrics"})


def _refuse(status: int, code: str, message: str, path: str = "") -> web.Response:
    if path in TEXT_PATHS:
        return web.Response(text=f"{code}: {message}\n", status=status)
    return web.Response(body=encode_rpc_error(None, code, message), status=status,
                        content_type="application/msgpack")


def auth_handler(
    auth: Authenticator, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Wrap a route handler: refuse requests without valid credentials, record the principal
    of the others (see masterd.api.limits.guard_handler for why this is not a middleware)."""

    async def authenticated(request: web.Request) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        transport = request.transport
        peercert = None
        if transport is not None and auth.tls_clients:
            sslobj = transport.get_extra_info("ssl_object")
            peercert = sslobj.getpeercert() if sslobj is not None else None
        principal = auth.authenticate(request.headers.get("Authorization"), peercert)
        if principal is None:
            peer = request.remote or "?"
            log.warning("refused unauthenticated %s %s from %s", request.method, request.path,
                        peer)
            return _refuse(401, "unauthenticated",
                           "missing or invalid credentials: send 'Authorization: Bearer "
                           "TOKEN' or a client certificate the master trusts", request.path)
        request[PRINCIPAL_KEY] = principal
        return await handler(request)

    return authenticated


def principal_of(request: web.Request) -> Principal | None:
    return request.get(PRINCIPAL_KEY)


def authorize_rpc(principal: Principal | None, method: str, params: dict[str, Any],
                  master: Any) -> None:
    """Raise ``forbidden`` unless ``principal`` may call ``method`` with ``params``."""
    if principal is None or principal.is_admin:
        return
    if principal.role == "node":
        if method not in NODE_METHODS:
            raise ProtocolError("forbidden", f"nodes may not call {method!r}; nodes speak "
                                "on /v1/node")
        return
    if method not in CLIENT_METHODS:
        raise ProtocolError("forbidden", f"{method!r} is an admin-only method; "
                            f"client {principal.name!r} may not call it")
    if method in ("submit", "submit_many"):
        if not master.config.clients_may_submit:
            raise ProtocolError("forbidden", "this master does not let clients submit jobs; "
                                "ask an operator")
        jobs = [params.get("job")] if method == "submit" else params.get("jobs")
        for job in jobs if isinstance(jobs, list) else [None]:
            user = job.get("user") if isinstance(job, dict) else None
            if user != principal.name:
                raise ProtocolError("forbidden", f"client {principal.name!r} may submit jobs "
                                    f"only as Unix user {principal.name!r}, not {user!r}")
    elif method == "cancel":
        job_id = params.get("id")
        job = master.core.jobs.get(job_id) if isinstance(job_id, str) else None
        if job is not None and job.spec.user != principal.name:
            raise ProtocolError("forbidden", f"job {job_id} belongs to {job.spec.user!r}; only "
                                "its owner or an admin may cancel it")


def check_node_identity(principal: Principal | None, node_name: str) -> None:
    """A node credential speaks for one node only (open loopback access for any)."""
    if principal is None or principal.via == "open":
        return
    if principal.role != "node":
        raise ProtocolError("forbidden", f"a {principal.role} credential cannot register a "
                            "node")
    if principal.name != node_name:
        raise ProtocolError("forbidden", f"this credential belongs to node {principal.name!r} "
                            f"and cannot register as {node_name!r}")


def node_may_connect(principal: Principal | None) -> bool:
    return principal is None or principal.via == "open" or principal.role == "node"
