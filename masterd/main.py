"""``trellis-masterd``: the master service.

Signals: SIGHUP reloads the configuration keys that can change at run time (see
``RELOADABLE``), SIGTERM/SIGINT drain (refuse new requests, let the ones in flight finish and
their journal writes land) and exit. Under systemd (``Type=notify``) the master reports
READY=1 once its journal is open and it listens, a STATUS= line with what it is doing, and
WATCHDOG=1 pings when the unit has a watchdog.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, web

from masterd.api.app import GATE_KEY, make_app
from masterd.api.authn import auth_handler, build_authenticator, build_ssl, warn_if_open
from masterd.api.limits import GuardedSite, PeerLimits, guard_handler
from masterd.api.standby import make_standby_app
from masterd.gcpause import GcPausePolicy
from masterd.journal.backends import check_location, open_store
from masterd.journal.lease import Lease
from masterd.journal.store import Store, StoreError
from masterd.service.leader import ElectionTiming, Elector
from masterd.service.master import Master
from shared.auth import AuthError
from shared.config import ConfigError, MasterConfig, load_config
from shared.eventloop import install_uvloop
from shared.logs import set_level, setup_logging
from shared.sdnotify import Notifier

log = logging.getLogger("trellis.master")

# Keys a SIGHUP applies to the running master; every other change needs a restart.
RELOADABLE = frozenset({"log_level", "stop_grace_s", "node_grace_s", "command_timeout_s",
                        "allowed_users", "allow_root_jobs"})
# Time limits (masterd/features/timelimits.py): a new maximum opens or closes waiting jobs'
# time_limit gates; a new default applies to later submissions.
RELOADABLE |= {"default_time_limit_s", "max_time_limit_s", "max_grace_s"}
# Partitions (masterd/features/partitions.py): nodes re-labelled; a removed partition that
# queued jobs still need stays until they are gone.
RELOADABLE |= {"partitions"}
# Priority classes (masterd/features/priorityclasses.py): the queue re-ordered, preemption
# by the new rules from the next pass.
RELOADABLE |= {"priority_classes"}
DRAIN_TIMEOUT_S = 10.0
STATUS_PERIOD_S = 5.0
# Exit status of a master that lost the leadership (EX_TEMPFAIL): its supervisor starts it
# again, as a standby.
EXIT_LEADERSHIP_LOST = 75


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trellis-masterd",
        description="Trellis master: schedules jobs on GPU nodes and serves the admin RPC.",
        epilog="Signals: SIGHUP reloads log_level, stop_grace_s, node_grace_s, "
               "command_timeout_s, allowed_users, allow_root_jobs, default_time_limit_s, "
               "max_time_limit_s and max_grace_s; SIGTERM drains and exits. Metrics: GET "
               "/metrics on the listen port.",
    )
    p.add_argument("-c", "--config", help="TOML configuration file ([master] section)")
    p.add_argument("--listen-host", help="address to listen on (overrides the config)")
    p.add_argument("--listen-port", type=int, help="port to listen on (overrides the config)")
    p.add_argument("--state-dir", help="directory of the journal (overrides the config)")
    p.add_argument("--policy", help="scheduling policy name (overrides the config)")
    p.add_argument("--log-level", help="debug, info, warning or error")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def config_changes(old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every top-level field that differs between two configs."""
    return [
        (f.name, getattr(old, f.name), getattr(new, f.name))
        for f in dataclasses.fields(old)
        if getattr(old, f.name) != getattr(new, f.name)
    ]


class MasterDaemon:
    """The master process around :class:`Master`: HTTP serving, reload, drain, notify."""

    def __init__(self, config: MasterConfig, config_path: str | None = None,
                 overrides: dict[str, Any] | None = None,
                 notifier: Notifier | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = overrides or {}
        self.notifier = notifier or Notifier(environ={})
        self.master: Master | None = None
        self.runner: web.AppRunner | None = None
        self._background: list[asyncio.Task[None]] = []
        self.gc = GcPausePolicy()
        # High availability (a PostgreSQL store): the election, the standby's endpoints
        # until this master leads, and what to do when the leadership is lost.
        self.elector: Elector | None = None
        self._standby: web.AppRunner | None = None
        self.stop_event: asyncio.Event | None = None
        self.exit_code = 0

    def advertise_url(self) -> str:
        """Where clients and nodes reach this master (a standby names it to them)."""
        c = self.config
        if c.advertise_url:
            return c.advertise_url.rstrip("/")
        host = c.listen_host if c.listen_host not in ("0.0.0.0", "::", "") else \
            socket.getfqdn()
        return f"{'https' if c.tls_cert_file else 'http'}://{host}:{c.listen_port}"

    async def start(self) -> None:
        config = self.config
        auth, ssl_context = build_authenticator(config), build_ssl(config)
        warn_if_open(auth, config)
        limits = PeerLimits(config.max_connections_per_ip, config.request_timeout_s)

        def wrap(handler: Any) -> Any:
            return guard_handler(limits, auth_handler(auth, handler))

        store: Store | None = None
        if config.store:
            check_location(config.store)
            store = await self._lead(wrap, limits, ssl_context)
        else:
            self.notifier.status(f"opening the journal in {config.state_dir}")
        self.master = master = Master(config, store=store)
        if self.elector is not None:
            master.leadership = self.elector.state
        master.restore()
        # After the restore: the restored jobs are the first long-lived objects to freeze.
        self.gc = GcPausePolicy(config.gc_young_threshold, config.gc_refreeze_s)
        self.gc.install()
        self.runner = web.AppRunner(make_app(master, wrap), access_log=None,
                                    shutdown_timeout=5.0)
        await self.runner.setup()
        if self._standby is not None:  # the leader's endpoints take the port over
            await self._standby.cleanup()
            self._standby = None
        site = GuardedSite(self.runner, config.listen_host, config.listen_port, limits=limits,
                           ssl_context=ssl_context)
        await site.start()
        log.info("listening host=%s port=%d policy=%s state_dir=%s", config.listen_host,
                 config.listen_port, config.policy, config.state_dir)
        self.notifier.ready(self.describe())
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self.notifier.watchdog_loop()),
                            loop.create_task(self._report_status()),
                            loop.create_task(self._refreeze())]

    async def _lead(self, wrap: Any, limits: PeerLimits, ssl_context: Any) -> Store:
        """Serve as a standby until this master wins the election; the journal, opened with
        the won epoch."""
        config = self.config
        loop = asyncio.get_running_loop()
        elected: asyncio.Future[Lease] = loop.create_future()

        def on_elected(won: Lease) -> None:
            if not elected.done():
                elected.set_result(won)

        self.elector = Elector(
            config.store, self.advertise_url(),
            ElectionTiming(config.lease_s, config.renew_deadline_s, config.retry_s), loop,
            on_elected, self._leadership_lost)
        self._standby = web.AppRunner(make_standby_app(self.elector.state, wrap),
                                      access_log=None, shutdown_timeout=1.0)
        await self._standby.setup()
        await GuardedSite(self._standby, config.listen_host, config.listen_port, limits=limits,
                          ssl_context=ssl_context).start()
        log.info("standby listening host=%s port=%d url=%s", config.listen_host,
                 config.listen_port, self.advertise_url())
        self.notifier.ready("standby: another master leads or the election is under way")
        self.elector.start()
        won = await elected
        self.notifier.status(f"leading at epoch {won.epoch}: opening the journal")
        return await loop.run_in_executor(None, lambda: open_store(config.store, won.epoch))

    def _leadership_lost(self, reason: str) -> None:
        """Stop scheduling at once, then stop the daemon (to be started again as a standby)."""
        if self.master is not None:
            self.master.halt(f"leadership lost: {reason}")
        self.exit_code = EXIT_LEADERSHIP_LOST
        self.notifier.status(f"leadership lost ({reason}): stopping")
        if self.stop_event is not None:
            self.stop_event.set()

    def describe(self) -> str:
        master = self.master
        if master is None:
            return "standby"
        assert master is not None
        core = master.core
        return (f"serving on {self.config.listen_host}:{self.config.listen_port}: "
                f"nodes={len(master.sessions)}/{len(core.cluster.node_names)} "
                f"queued={len(core.queue())} active={len(core.active_jobs())}")

    async def _refreeze(self) -> None:
        while True:
            await asyncio.sleep(min(60.0, self.config.gc_refreeze_s))
            self.gc.maybe_refreeze()

    async def _report_status(self) -> None:
        while True:
            await asyncio.sleep(STATUS_PERIOD_S)
            self.notifier.status(self.describe())

    def reload(self) -> bool:
        """Re-read the configuration file; apply what can change at run time.

        An unreadable or invalid file is refused as a whole and the running configuration kept.
        """
        master = self.master
        self.notifier.reloading()
        try:
            new = load_config(MasterConfig, self.config_path, "master", **self.overrides)
        except ValueError as exc:  # ConfigError, or a check in the config's own code
            log.error("config_reload refused reason=%r; keeping the running configuration",
                      str(exc))
            self.notifier.ready(self.describe() if master else "starting")
            return False
        changes = config_changes(self.config, new)
        applied: dict[str, Any] = {}
        for key, old, value in changes:
            if key in RELOADABLE:
                applied[key] = value
                log.info("config_reload key=%s change=%r→%r", key, old, value)
            else:
                log.warning("config_reload key=%s change=%r→%r not applied: needs a restart",
                            key, old, value)
        if not changes:
            log.info("config_reload unchanged path=%s", self.config_path)
        if applied:
            self.config = dataclasses.replace(self.config, **applied)
            if "log_level" in applied:
                set_level(self.config.log_level)
                if master is not None:
                    master.log_level_changed(self.config.log_level)
            if master is not None:
                master.config = self.config
                for session in master.sessions.values():
                    session.timeout_s = self.config.command_timeout_s
                master.events.config_changed.emit()
        self.notifier.ready(self.describe() if master else "starting")
        return True

    async def close(self) -> None:
        """Drain: refuse new requests (503), wait for those in flight, close node sessions,
        stop listening, then close the journal after its pending writes."""
        self.notifier.stopping("draining: refusing new requests")
        for task in self._background:
            task.cancel()
        if self.master is not None:
            self.master.features.logs.close()  # followers' long polls end now
            self.master.features.relays.close()  # relayed terminals and ports end now
        if self.runner is not None:
            app = self.runner.app
            gate = app[GATE_KEY]
            remaining = await gate.drain(DRAIN_TIMEOUT_S)
            log.info("draining inflight_left=%d; closing node sessions=%d", remaining,
                     len(self.master.sessions) if self.master else 0)
            if self.master is not None:
                for session in list(self.master.sessions.values()):
                    with contextlib.suppress(Exception):
                        await session.ws.close(code=WSCloseCode.GOING_AWAY,
                                               message=b"master shutting down")
            await self.runner.cleanup()
        if self._standby is not None:
            await self._standby.cleanup()
        if self.master is not None:
            await self.master.close()
        if self.elector is not None:  # after the journal: the lock goes with the last write
            self.elector.stop()
        self.gc.uninstall()
        log.info("stopped; journal closed")
        self.notifier.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = dict(listen_host=args.listen_host, listen_port=args.listen_port,
                     state_dir=args.state_dir, policy=args.policy, log_level=args.log_level)
    try:
        config = load_config(MasterConfig, args.config, "master", **overrides)
        setup_logging(config.log_level)
    except (ConfigError, ValueError) as exc:
        print(f"trellis-masterd: {exc}", file=sys.stderr)
        return 2
    install_uvloop()
    notifier = Notifier()
    config_path = str(Path(args.config).resolve()) if args.config else None

    async def run() -> None:
        daemon = MasterDaemon(config, config_path, overrides, notifier)
        stop = asyncio.Event()
        daemon.stop_event = stop
        loop = asyncio.get_running_loop()

        def on_stop(sig: signal.Signals) -> None:
            log.info("signal=%s: shutting down", sig.name)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, daemon.reload)
        try:
            # A standby waits in start() until it leads: a signal must still stop it.
            starting = loop.create_task(daemon.start())
            stopping = loop.create_task(stop.wait())
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
            else:
                starting.result()
                await stopping
        finally:
            await daemon.close()
        return daemon.exit_code

    try:
        code = asyncio.run(run())
    except AuthError as exc:
        log.error("cannot start: %s", exc)
        return 2
    except (StoreError, ValueError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
