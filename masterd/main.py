"""``trellis-masterd``: the master service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from masterd.app import make_app
from masterd.authn import auth_middleware, build_authenticator, build_ssl, warn_if_open
from masterd.limits import GuardedSite, PeerLimits, limits_middleware
from masterd.service import Master
from masterd.store import StoreError
from shared.auth import AuthError
from shared.config import ConfigError, MasterConfig, load_config
from shared.logs import setup_logging

log = logging.getLogger("trellis.master")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trellis-masterd",
        description="Trellis master: schedules jobs on GPU nodes and serves the admin RPC.",
    )
    p.add_argument("-c", "--config", help="TOML configuration file ([master] section)")
    p.add_argument("--listen-host", help="address to listen on (overrides the config)")
    p.add_argument("--listen-port", type=int, help="port to listen on (overrides the config)")
    p.add_argument("--state-dir", help="directory of the journal (overrides the config)")
    p.add_argument("--policy", help="scheduling policy name (overrides the config)")
    p.add_argument("--log-level", help="debug, info, warning or error")
    return p.parse_args(argv)


async def serve(config: MasterConfig, stop: asyncio.Event) -> None:
    auth, ssl_context = build_authenticator(config), build_ssl(config)
    warn_if_open(auth, config)
    limits = PeerLimits(config.max_connections_per_ip, config.request_timeout_s)
    master = Master(config)
    master.restore()
    runner = web.AppRunner(
        make_app(master, (limits_middleware(limits), auth_middleware(auth))), access_log=None)
    await runner.setup()
    site = GuardedSite(runner, config.listen_host, config.listen_port, limits=limits,
                       ssl_context=ssl_context)
    await site.start()
    log.info("listening on %s:%d policy=%s state=%s", config.listen_host, config.listen_port,
             config.policy, config.state_dir)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await runner.cleanup()
        await master.close()


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(
            MasterConfig, args.config, "master",
            listen_host=args.listen_host, listen_port=args.listen_port,
            state_dir=args.state_dir, policy=args.policy, log_level=args.log_level,
        )
        setup_logging(config.log_level)
    except (ConfigError, ValueError) as exc:
        print(f"trellis-masterd: {exc}", file=sys.stderr)
        return 2
    install_uvloop()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, stop)

    try:
        asyncio.run(run())
    except AuthError as exc:
        log.error("cannot start: %s", exc)
        return 2
    except (StoreError, ValueError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
