"""trellisctl's credentials: a bearer token file and/or a TLS client certificate.

Each comes from a flag, else an environment variable, else ``trellisctl.toml``:

| what | flag | environment | config key |
| --- | --- | --- | --- |
| token file | ``--token-file`` | ``TRELLIS_TOKEN_FILE`` | ``token_file`` |
| CA bundle | ``--ca-file`` | ``TRELLIS_CA_FILE`` | ``ca_file`` |
| client certificate | ``--cert-file`` | ``TRELLIS_CERT_FILE`` | ``cert_file`` |
| its key | ``--key-file`` | ``TRELLIS_KEY_FILE`` | ``key_file`` |

The token itself is never printed: errors name the file only.
"""

from __future__ import annotations

import argparse
import os
import ssl
import tomllib
from pathlib import Path
from typing import Any

from shared.auth import AuthError, Secret, client_ssl_context, read_token

SETTINGS = (("token_file", "TRELLIS_TOKEN_FILE"), ("ca_file", "TRELLIS_CA_FILE"),
            ("cert_file", "TRELLIS_CERT_FILE"), ("key_file", "TRELLIS_KEY_FILE"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token-file", help="file holding the bearer token (mode 0600; "
                                             "default $TRELLIS_TOKEN_FILE)")
    parser.add_argument("--ca-file", help="CA bundle that signed the master's certificate")
    parser.add_argument("--cert-file", help="TLS client certificate (mutual TLS)")
    parser.add_argument("--key-file", help="private key of --cert-file")


def _config(paths: tuple[Path, ...]) -> dict[str, Any]:
    for path in paths:
        if path.is_file():
            try:
                with open(path, "rb") as f:
                    return tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise AuthError(f"{path}: {exc}") from None
    return {}


def credentials(args: argparse.Namespace, url: str, config_paths: tuple[Path, ...]
                ) -> dict[str, Any]:
    """Keyword arguments for MasterClient: ``token`` and ``ssl_context``."""
    config = _config(config_paths)
    values: dict[str, str | None] = {}
    for key, env in SETTINGS:
        value = getattr(args, key, None) or os.environ.get(env) or config.get(key)
        values[key] = str(value) if value else None
    token: Secret | None = None
    if values["token_file"]:
        token = read_token(values["token_file"])
    ssl_context: ssl.SSLContext | None = None
    if url.startswith("https:") or values["cert_file"]:
        ssl_context = client_ssl_context(values["ca_file"], values["cert_file"],
                                         values["key_file"])
    return {"token": token, "ssl_context": ssl_context}
