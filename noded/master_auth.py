"""How noded proves itself to the master: its token file and/or TLS client certificate."""

from __future__ import annotations

import ssl

from shared.auth import bearer_header, client_ssl_context, read_token
from shared.config import NodeConfig


def master_credentials(config: NodeConfig) -> tuple[dict[str, str], ssl.SSLContext | None]:
    """HTTP headers and TLS context for the master connection (raises AuthError)."""
    token = read_token(config.token_file, "node token file") if config.token_file else None
    ssl_context = None
    if config.master_url.startswith("https:") or config.tls_cert_file:
        ssl_context = client_ssl_context(config.tls_ca_file or None,
                                         config.tls_cert_file or None,
                                         config.tls_key_file or None)
    return bearer_header(token), ssl_context
