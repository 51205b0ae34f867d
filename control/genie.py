"""trellisctl's GENIE and SODA commands: ``models``, ``profile``, ``profiles``, ``pools``."""

from __future__ import annotations

import argparse

from control.client import MasterClient
from control.usage import UsageError
from control.views import show_models, show_pools, show_profiles

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def profile_params(args: argparse.Namespace) -> dict[str, Any]:
    command = list(args.job_command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("profile needs a command: trellisctl profile TYPE [options] -- CMD")
    params: dict[str, Any] = {"model_type": args.model_type, "command": command,
                              "user": args.user or _me(), "kind": args.kind}
    if args.batches:
        try:
            params["batches"] = [int(b) for b in args.batches.split(",") if b.strip()]
        except ValueError:
            raise UsageError(f"--batches {args.batches!r}: expected e.g. 8,16,32,64") from None
    for key in ("gpu_model", "global_batch", "iterations", "max_nodes", "max_gpus_per_node",
                "cpus_per_gpu", "family", "params_m", "tenant"):
        value = getattr(args, key)
        if value is not None:
            params[key] = value
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    if env:
        params["env"] = env
    return params


def model_rows(path: str) -> dict[str, Any]:
    """A model database file, checked here so a typo is reported with its path."""
    from masterd.core.genie.modeldb import ROW_FIELDS, ModelDB, ModelDBError

    try:
        db = ModelDB.load(path)
    except ModelDBError as exc:
        raise UsageError(str(exc)) from None
    rows = [{k: v for k, v in zip(ROW_FIELDS, row, strict=True) if v is not None}
            for row in db.to_rows()]
    params: dict[str, Any] = {"rows": rows}
    if db.default_gpu_model is not None:
        params["default_gpu_model"] = db.default_gpu_model
    return params


def run_genie(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str] | None:
    cmd = args.command
    if cmd == "models":
        if args.models_action == "load":
            result = client.call("load_models", model_rows(args.file))
            return result, f"loaded {result['loaded']} model(s): {', '.join(result['models'])}"
        result = client.call("models")
        return result, show_models(result)
    if cmd == "profile":
        result = client.call("profile", profile_params(args))
        c = result["profile"]
        return result, (f"profiling {c['model_type']} on {c['gpu_model']} as {c['id']}: "
                        f"{len(c['runs'])} runs ({', '.join(r['job_id'] for r in c['runs'])})")
    if cmd == "profiles":
        params = {"id": args.profile_id} if args.profile_id else {}
        result = client.call("profiles", params)
        return result, show_profiles(result, detail=bool(args.profile_id))
    if cmd == "pools":
        if args.resize:
            client.call("resize_arrays")
        result = client.call("pools")
        return result, show_pools(result)
    return None


def _me() -> str:
    import getpass

    return getpass.getuser()
