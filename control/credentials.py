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

import os
from collections.abc import Sequence

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from typing import Any

    from shared.auth import Secret

# shared.auth (and with it ssl, hashlib, ...) is imported only when a token file or TLS is
# configured: trellisctl's start-up pays for what a command uses.

SETTINGS = (("token_file", "TRELLIS_TOKEN_FILE"), ("ca_file", "TRELLIS_CA_FILE"),
            ("cert_file", "TRELLIS_CERT_FILE"), ("key_file", "TRELLIS_KEY_FILE"))


def add_arguments(parser: Any, default: Any = None) -> None:
    """The credential options on ``parser`` (a parser or an argument group); ``default``:
    argparse.SUPPRESS where the same options also sit on a subcommand."""
    parser.add_argument("--token-file", default=default,
                        help="file holding the bearer token (mode 0600; default "
                             "$TRELLIS_TOKEN_FILE)")
    parser.add_argument("--ca-file", default=default,
                        help="CA bundle that signed the master's certificate")
    parser.add_argument("--cert-file", default=default,
                        help="TLS client certificate (mutual TLS)")
    parser.add_argument("--key-file", default=default, help="private key of --cert-file")


def read_config(paths: Sequence[str]) -> dict[str, Any]:
    """The first of ``paths`` that exists, as a table (empty when none does)."""
    for path in paths:
        if os.path.isfile(path):
            import tomllib

            try:
                with open(path, "rb") as f:
                    return tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                from shared.auth import AuthError

                raise AuthError(f"{path}: {exc}") from None
    return {}


def credentials(args: Any, url: str, config_paths: Sequence[str]) -> dict[str, Any]:
    """Keyword arguments for MasterClient: ``token`` and ``ssl_context``."""
    config = read_config(config_paths)
    values: dict[str, str | None] = {}
    for key, env in SETTINGS:
        value = getattr(args, key, None) or os.environ.get(env) or config.get(key)
        values[key] = str(value) if value else None
    token: Secret | None = None
    if values["token_file"]:
        from shared.auth import read_token

        token = read_token(values["token_file"])
    ssl_context: ssl.SSLContext | None = None
    if url.startswith("https:") or values["cert_file"]:
        from shared.auth import client_ssl_context

        ssl_context = client_ssl_context(values["ca_file"], values["cert_file"],
                                         values["key_file"])
    return {"token": token, "ssl_context": ssl_context}
