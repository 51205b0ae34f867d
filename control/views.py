"""What trellisctl prints for each reply: tables, ``-o wide`` tables and descriptions.

Pure functions of the master's replies (plain maps), imported only for table output.
"""

from __future__ import annotations

import json
import time

from control.tables import render_table
from shared.cpulist import format_cpu_list

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def dash(value: Any) -> str:
    """A field as printed: ``-`` when empty (None, "", an empty list), else its text."""
    if value is None or value == "" or value == [] or value == {}:
        return "-"
    return str(value)


def _fmt_time(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def _fmt_seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f}s"


def show_jobs(jobs: list[dict[str, Any]]) -> str:
    rows = [[j["id"], j["state"], j["kind"], j["tenant"], j["qos"], str(j["gpus"]),
             str(j["cpus"]), ",".join(j["nodes"]) or "-", _fmt_seconds(j["queued_s"]),
             "-" if j["exit_code"] is None and j["signal"] is None
             else (f"sig{j['signal']}" if j["signal"] is not None else str(j["exit_code"]))]
            for j in jobs]
    return render_table(["ID", "STATE", "KIND", "TENANT", "QOS", "GPUS", "CPUS", "NODES",
                         "QUEUED", "EXIT"], rows)


def _exit(j: dict[str, Any]) -> str:
    if j["exit_code"] is None and j["signal"] is None:
        return "-"
    return f"sig{j['signal']}" if j["signal"] is not None else str(j["exit_code"])


def show_jobs_wide(jobs: list[dict[str, Any]]) -> str:
    rows = [[j["id"], j["name"], j["state"], j["kind"], j.get("partition") or "-", j["tenant"],
             j["user"], j["qos"], str(j["gpus"]), str(j["cpus"]), str(j["memory_mib"]),
             " ".join(f"{a['node']}:g{','.join(map(str, a['gpus'])) or '-'}"
                      f":c{_cpus(a['cpus'])}" for a in j["placement"]) or "-",
             _fmt_time(j["submit_time"]), _fmt_time(j["start_time"]), _fmt_time(j["end_time"]),
             _fmt_seconds(j["queued_s"]), str(j["attempts"]), _exit(j), dash(j.get("wait")),
             j["reason"] or "-"]
            for j in jobs]
    return render_table(["ID", "NAME", "STATE", "KIND", "PARTITION", "TENANT", "USER", "QOS",
                         "GPUS", "CPUS", "MEM MIB", "PLACEMENT", "SUBMITTED", "STARTED", "ENDED",
                         "QUEUED", "ATTEMPTS", "EXIT", "WAIT", "REASON"], rows)


def _cpus(cpus: list[int]) -> str:
    return format_cpu_list(cpus) or "-"


def _util(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def show_nodes(nodes: list[dict[str, Any]]) -> str:
    rows = [[n["name"], n["status"], n["gpu_model"] or "-",
             f"{n['gpus'] - n['gpus_free']}/{n['gpus']}", f"{n['cpus'] - n['cpus_free']}/"
             f"{n['cpus']}", ",".join(map(str, n["gpus_unhealthy"])) or "-", str(len(n["jobs"]))]
            for n in nodes]
    return render_table(["NODE", "STATUS", "GPU MODEL", "GPUS USED", "CPUS USED", "UNHEALTHY",
                         "JOBS"], rows)


def show_nodes_wide(nodes: list[dict[str, Any]]) -> str:
    rows = []
    for n in nodes:
        utils = [g["utilization_pct"] for g in n["gpu_detail"]
                 if g.get("utilization_pct") is not None]
        rows.append([
            n["name"], n["status"], n["address"], n["gpu_model"] or "-",
            f"{n['gpus'] - n['gpus_free']}/{n['gpus']}",
            _util(sum(utils) / len(utils)) if utils else "-",
            f"{n['cpus'] - n['cpus_free']}/{n['cpus']}",
            f"{n['memory_mib'] - n['memory_free_mib']}/{n['memory_mib']}",
            ",".join(map(str, n["gpus_unhealthy"])) or "-", ",".join(n["jobs"]) or "-",
            ",".join(n.get("features") or ()) or "-",
            # Why it takes no new work (its first condition), as sinfo -R says.
            next((c["reason"] for c in n.get("conditions") or ()), "-")])
    return render_table(["NODE", "STATUS", "ADDRESS", "GPU MODEL", "GPUS USED", "GPU UTIL",
                         "CPUS USED", "MEM USED MIB", "UNHEALTHY", "JOBS", "FEATURES",
                         "REASON"], rows)


def show_partitions(partitions: list[dict[str, Any]]) -> str:
    if not partitions:
        return "this cluster has no partitions: jobs may use every node"
    from shared.partitions import duration

    def limit(seconds: float | None) -> str:
        return "-" if seconds is None else duration(seconds)

    rows = [[p["name"] + ("*" if p["default"] else ""), p.get("state", "up")
             + (f" ({p['state_reason']})" if p.get("state_reason") else ""),
             f"{p['schedulable']}/{p['node_count']}",
             f"{p['free_gpus']}/{p['gpus']}", limit(p["max_time_s"]),
             limit(p["default_time_s"]),
             ",".join(p["allow_accounts"]) or ("not " + ",".join(p["deny_accounts"])
                                               if p["deny_accounts"] else "all"),
             str(p.get("priority_tier", 0)), str(p["queued"]), str(p["running"]), p["nodes"]]
            for p in partitions]
    # As sinfo marks it: the default partition's name ends in "*".
    return render_table(["PARTITION", "STATE", "UP/NODES", "FREE GPUS", "MAX TIME", "DEFAULT TIME",
                         "ACCOUNTS", "TIER", "QUEUED", "RUNNING", "NODELIST"], rows)


def show_priority_classes(classes: list[dict[str, Any]]) -> str:
    if not classes:
        return "this cluster has no priority classes"
    from shared.partitions import duration

    rows = [[c["name"] + ("*" if c["default"] else ""), str(c["priority"]),
             ",".join(c["preempts"]) or "-",
             ("own account" if c["within_account"] else "any account") if c["preempts"]
             else "-",
             duration(c["min_runtime_s"]) if c["min_runtime_s"] else "-",
             duration(c["preempt_grace_s"]), str(c["queued"]), str(c["running"])]
            for c in classes]
    return render_table(["CLASS", "PRIORITY", "PREEMPTS", "WHOSE", "MIN RUNTIME",
                         "GRACE IF PREEMPTED", "QUEUED", "RUNNING"], rows)


def show_node(result: dict[str, Any], wide: bool = False) -> str:
    from control import failures

    n = result["node"]
    lines = [
        f"{'Node:':<10}{n['name']} ({n['status']}) address {n['address']}",
        f"{'GPUs:':<10}{n['gpus']} x {n['gpu_model'] or '-'}, {n['gpus_free']} free",
        f"{'Cores:':<10}{n['cpus']}, {n['cpus_free']} free",
        f"{'Memory:':<10}{n['memory_mib']} MiB, {n['memory_free_mib']} MiB free",
    ]
    if n.get("features"):
        lines.append(f"{'Features:':<10}{','.join(n['features'])}")
    if n.get("reservations"):
        lines.append(f"{'Reserved:':<10}{','.join(n['reservations'])}")
    # Why it takes no new work, one line each (an older master sends no conditions).
    for condition in n.get("conditions") or ():
        since = condition.get("since")
        when = (" since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
                if since else "")
        lines.append(f"{'Closed:':<10}{condition['reason']}{when}")
    rdt = result.get("rdt") or {}
    if any(rdt.values()):
        lines.append(f"{'RDT:':<10}" + " ".join(f"{k}={'yes' if v else 'no'}"
                                                for k, v in rdt.items()))
    # Sections other features add to the reply (tc shaping, contention, ...) print as they
    # come: key=value per section.
    for key, value in result.items():
        if key in ("node", "jobs", "rdt") or not isinstance(value, dict) or not value:
            continue
        lines.append(f"{key.upper() + ':':<10}" + " ".join(f"{k}={v}" for k, v in value.items()))
    header = ["GPU", "UTIL", "HEALTH", "JOB"]
    gpu_rows = []
    for g in n["gpu_detail"]:
        row = [str(g["index"]), _util(g.get("utilization_pct")), failures.health(g),
               g.get("job") or "-"]
        if wide:
            row += [g["uuid"], g["model"], str(g["memory_mib"]), str(g["numa_node"]),
                    g.get("pci_bus_id") or "-"]
        gpu_rows.append(row)
    if wide:
        header += ["UUID", "MODEL", "MEM MIB", "NUMA", "PCI"]
    lines += ["", render_table(header, gpu_rows)]
    lines += failures.fault_lines(n["name"], n["gpu_detail"])
    lines.append("")
    job_rows = [[j["id"], j["state"], j["tenant"], j["user"], j["qos"],
                 ",".join(map(str, j["gpus"])) or "-", _cpus(j["cpus"]), str(j["memory_mib"])]
                for j in result["jobs"]]
    lines.append(render_table(["JOB", "STATE", "TENANT", "USER", "QOS", "GPUS", "CORES",
                               "MEM MIB"], job_rows) if job_rows else "no jobs")
    return "\n".join(lines)


def show_events(events: list[dict[str, Any]], header: bool = True) -> str:
    rows = [[str(e["seq"]), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])),
             e["job"] or "-", e["node"] or "-", e["kind"],
             " ".join(f"{k}={_detail(v)}" for k, v in e["detail"].items()
                      if v not in (None, ""))]
            for e in events]
    text = render_table(["SEQ", "TIME", "JOB", "NODE", "KIND", "DETAIL"], rows)
    return text if header else "\n".join(text.split("\n")[1:])


def _detail(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else \
        str(value)


def show_job(result: dict[str, Any]) -> str:
    j = result["job"]
    # Every field that can be empty prints as "-" (never "None").
    lines = [f"{k + ':':<12}{dash(v)}" for k, v in (
        ("Job", j["id"]), ("Name", j["name"]), ("State", j["state"]), ("Kind", j["kind"]),
        ("Tenant", j["tenant"]), ("User", j["user"]), ("QoS", j["qos"]),
        ("Resources", f"{j['gpus']} GPU(s), {j['cpus']} core(s), {j['memory_mib']} MiB"),
        ("Command", " ".join(j["command"])), ("Submitted", _fmt_time(j["submit_time"])),
        ("Started", _fmt_time(j["start_time"])), ("Ended", _fmt_time(j["end_time"])),
        ("Queued", _fmt_seconds(j["queued_s"])), ("Exit code", j["exit_code"]),
        ("Signal", j["signal"]), ("Reason", j["reason"]), ("Attempts", j["attempts"]),
        ("Restarts", j.get("restarts", 0)), ("Requeue", _requeue(j.get("requeue"))),
        ("Time limit", time_limit(j)),
    )]
    lines += _lifecycle(j)
    metrics = result.get("metrics") or {}
    if j.get("image"):
        lines.append(f"{'Image:':<12}{j['image']}{image_pull(j['state'], metrics)}")
    for a in j["placement"]:
        lines.append(f"{'Placement:':<12}{a['node']} gpus={_cpus(a['gpus'])} "
                     f"cpus={_cpus(a['cpus'])}")
    lines.extend(show_prediction(result.get("prediction")))
    if result.get("estimate"):  # QSSF's duration estimate (Helios)
        from control.helios import show_estimate

        lines.extend(show_estimate(result["estimate"]))
    if metrics:
        lines.append(f"{'Metrics:':<12}" + ", ".join(
            f"{name}={m['last']:.6g} (mean {m['value']:.6g}, {m['count']} reports)"
            for name, m in metrics.items()))
    lines.extend(show_usage(result.get("usage"), result.get("resources")))
    lines.append("Events:")
    for e in result.get("events", []):
        detail = ", ".join(f"{k}={v}" for k, v in e["detail"].items() if v not in (None, ""))
        lines.append(f"  {_fmt_time(e['time'])}  {e['kind']:<14} {dash(e['node']):<10} "
                     f"{detail}".rstrip())
    return "\n".join(lines)


def image_pull(state: str, metrics: dict[str, Any]) -> str:
    """Where the pull of a job's image stands, from what the node reported (noded/containers
    reports image_pull_layers and image_pull_s while it pulls, image_pulled once done)."""
    def last(name: str) -> float | None:
        m = metrics.get(name)
        return None if m is None else m.get("last")

    pull_s, layers = last("image_pull_s"), last("image_pull_layers")
    if last("image_cached"):
        return " (in the node's cache)"
    if last("image_pulled"):
        return f" (pulled in {pull_s:.1f} s)" if pull_s is not None else " (pulled)"
    if state not in ("starting", "running"):
        return ""
    if layers is not None:
        return f" (pulling: {layers:g} layer(s) copied, {pull_s or 0:.1f} s so far)"
    return " (pulling)" if state == "running" else ""


def _requeue(wanted: bool | None) -> str:
    """What the job said of being requeued after a failure (submit --requeue/--no-requeue)."""
    if wanted is None:
        return "the master's default (requeue_default)"
    return "yes (--requeue)" if wanted else "no (--no-requeue)"


def time_limit(j: dict[str, Any]) -> str | None:
    """A job's limit as Slurm prints it, its warning and grace, and when a running job
    reaches it; None (printed "-") without a limit."""
    if j.get("time_limit_s") is None:
        return None
    from shared.slurmtime import format_time

    parts = [f"warning {j['warning']}"] if j.get("warning") else []
    if j.get("grace_s") is not None:
        parts.append(f"grace {j['grace_s']:g}s")
    if j.get("time_limit_at") is not None:
        parts.append(f"reached at {_fmt_time(j['time_limit_at'])}")
    return format_time(j["time_limit_s"]) + (f" ({', '.join(parts)})" if parts else "")


def _lifecycle(j: dict[str, Any]) -> list[str]:
    """Why it waits, who holds it, what it depends on, its priority and array: the lines
    that say something (a plain job shows none of them)."""
    lines = []
    if j.get("wait"):
        lines.append(f"{'Waits:':<12}{j['wait']} ({j['reason'] or '-'})")
    if j.get("held"):
        lines.append(f"{'Held:':<12}by {'an admin' if j['held'] == 'admin' else 'its user'}")
    if j.get("after"):
        lines.append(f"{'After:':<12}{j['after']}")
    if j.get("partition"):
        lines.append(f"{'Partition:':<12}{j['partition']}")
    if j.get("reservation"):
        lines.append(f"Reservation: {j['reservation']}")  # one wider than the others
    if j.get("priority_class"):
        lines.append(f"{'Class:':<12}{j['priority_class']}")
    if j.get("constraint"):
        lines.append(f"{'Constraint:':<12}{j['constraint']}")
    if j.get("nodelist"):
        lines.append(f"{'Nodelist:':<12}{','.join(j['nodelist'])}")
    if j.get("exclude"):
        lines.append(f"{'Excludes:':<12}{','.join(j['exclude'])}")
    if j.get("priority"):
        lines.append(f"{'Priority:':<12}{j['priority']}")
    if j.get("array"):
        lines.append(f"{'Array:':<12}{j['array']['id']} task {j['array']['index']}")
    return lines


def _phases(u: dict[str, Any]) -> str:
    """Liquid's phases as the node cut them (launching, and saving once the part ended)."""
    parts = [f"{name}={u[key]:.1f} s" for key, name in (("pre_s", "pre"), ("post_s", "post"))
             if u.get(key) is not None]
    return " phases " + " ".join(parts) if parts else ""


def show_usage(usage: list[dict[str, Any]] | None,
               resources: dict[str, float] | None) -> list[str]:
    """What the job's parts really used (noded's job_usage), and Liquid's prediction."""
    lines = []
    for u in usage or []:
        net = u.get("net_tx_bytes"), u.get("net_rx_bytes")
        lines.append(
            f"{'Usage:':<12}{u['node']}{'' if u.get('final') else ' (running)'} "
            f"cpu peak={_num(u.get('cpu_peak'), '.2f')} mean={_num(u.get('cpu_mean'), '.2f')} "
            f"mem peak={_num(u.get('memory_peak_mib'), '.0f')} MiB "
            f"gpu util={_num(u.get('gpu_util_mean'), '.1f')}%"
            f"±{_num(u.get('gpu_util_std'), '.1f')} "
            f"gpu mem peak={_num(u.get('gpu_memory_peak_mib'), '.0f')} MiB "
            f"net tx={_num(net[0], 'd')} rx={_num(net[1], 'd')} B "
            f"over {_num(u.get('seconds'), '.0f')} s"
            + _phases(u))
    if resources:
        names = (("liquid.gpu_util", "gpu util", 100.0, "%"), ("liquid.gpu_mem_mib", "gpu mem",
                 1.0, " MiB"), ("liquid.cpu", "cpu", 1.0, ""), ("liquid.mem_mib", "mem", 1.0,
                 " MiB"), ("liquid.net_mbps", "net", 1.0, " MB/s"),
                 ("liquid.pre_s", "pre", 1.0, " s"), ("liquid.post_s", "post", 1.0, " s"))
        lines.append(f"{'Predicted:':<12}" + ", ".join(
            f"{label}={resources[key] * scale:.3g}{unit}" for key, label, scale, unit in names
            if key in resources))
    return lines


def _num(x: float | None, fmt: str = ".4g") -> str:
    return "-" if x is None else format(x, fmt)


def show_prediction(p: dict[str, Any] | None) -> list[str]:
    """GENIE's view of the job: model, fallback, predicted latency, ECT and allowance."""
    if not p:
        return []
    lines = ["Prediction:"]
    model = p.get("model")
    what = f"type {p['model_type'] or '(none)'}, batch {p['batch'] or '-'}, " \
           f"{p['iterations'] or '-'} iterations ({p['kind']})"
    lines.append(f"  {'Task:':<16}{what}")
    if model:
        lines.append(f"  {'Model:':<16}{model['model_type']} on {model['gpu_model']}; "
                     f"source: {model['source'] or '-'}")
        c = model["coefficients"]
        lines.append(f"  {'Coefficients:':<16}k0={_num(c['k0'])} k1={_num(c['k1'])} "
                     f"k2={_num(c['k2'])} gamma={_num(c['gamma'])} lambda={_num(c['lam'])} "
                     f"nu={_num(c['nu'])}")
    else:
        lines.append(f"  {'Model:':<16}none")
    fallback = "FALLBACK: " + p["fallback_reason"] if p["fallback"] else "no (profiled model)"
    lines.append(f"  {'Fallback:':<16}{fallback}")
    place = p.get("placement")
    if place:
        cer = f", CER {place['cer']:.4g}" if place.get("cer") is not None else ""
        rate = f"{place['rate']:.1f} samples/s" if place.get("rate") else "infeasible"
        lines.append(f"  {'Placement:':<16}{place['d_node']} node(s) x {place['d_gpn']} GPU(s)"
                     f" of {place['gpu_model']}: {rate}{cer}")
    lines.append(f"  {'Latency:':<16}{_num(p['predicted_latency_s'], '.1f')}s predicted "
                 f"(one GPU: {_num(p['single_gpu_latency_s'], '.1f')}s)")
    if "actual_latency_s" in p:
        err = p.get("prediction_error")
        lines.append(f"  {'Actual:':<16}{p['actual_latency_s']:.1f}s"
                     + (f" (prediction off by {100 * err:+.1f}%)" if err is not None else ""))
    deadline = "deadline" if p.get("deadline") is not None else f"ECT of QoS {p['qos']}"
    lines.append(f"  {'Expected by:':<16}{_fmt_time(p['ect'])} ({deadline})")
    if p.get("waiting_allowance_s") is not None:
        meets = "meets its ECT" if p["meets_ect"] else "cannot meet its ECT"
        lines.append(f"  {'Allowance:':<16}{p['waiting_allowance_s']:.1f}s "
                     f"({meets}; {p['explained_by']} order)")
    return lines


def show_models(result: dict[str, Any]) -> str:
    rows = [[m["model_type"], m["gpu_model"], m["kind"], m["family"] or "-", _num(m["k0"]),
             _num(m["k1"]), _num(m["k2"]), _num(m["gamma"]), _num(m["lam"]), _num(m["nu"]),
             ("stored: " if m["stored"] else "") + (m["source"] or "-")]
            for m in result["models"]]
    text = render_table(["MODEL TYPE", "GPU MODEL", "KIND", "FAMILY", "K0", "K1", "K2", "GAMMA",
                         "LAMBDA", "NU", "SOURCE"], rows)
    if result.get("default_gpu_model"):
        text += f"\nUnprofiled GPU models fall back to {result['default_gpu_model']}."
    return text


def _fit_error(c: dict[str, Any]) -> str:
    fit = c.get("fit")
    if not fit:
        return "-"
    parts = [f"1-GPU {100 * fit['single_gpu_error']:.1f}%"]
    if fit.get("placement_error") is not None:
        parts.append(f"multi {100 * fit['placement_error']:.1f}%")
    return ", ".join(parts)


def show_profiles(result: dict[str, Any], detail: bool) -> str:
    rows = [[c["id"], c["model_type"], c["gpu_model"], c["kind"], c["state"],
             f"{c['runs_done']}/{len(c['runs'])}" + (f" ({c['runs_failed']} failed)"
                                                     if c["runs_failed"] else ""),
             _fit_error(c), c["error"] or "-"]
            for c in result["profiles"]]
    text = render_table(["ID", "MODEL TYPE", "GPU MODEL", "KIND", "STATE", "RUNS", "FIT ERROR",
                         "ERROR"], rows)
    if detail:
        for c in result["profiles"]:
            if c.get("fit"):
                f = c["fit"]
                text += (f"\nFit: k0={_num(f['k0'])} k1={_num(f['k1'])} k2={_num(f['k2'])} "
                         f"gamma={_num(f['gamma'])} lambda={_num(f['lam'])} nu={_num(f['nu'])}")
            runs = [[r["job_id"], r["phase"], f"<{r['d_node']}, {r['d_gpn']}>", str(r["batch"]),
                     r["state"], _num(r["rate"], ".2f"), _num(r["seconds"], ".1f"),
                     str(r["reports"]), r["reason"] or "-"] for r in c["runs"]]
            text += "\n" + render_table(["RUN", "PHASE", "SHAPE", "BATCH", "STATE",
                                          "SAMPLES/S", "SECONDS", "REPORTS", "REASON"], runs)
    return text


def show_pools(result: dict[str, Any]) -> str:
    rows = [[a["name"], a["kind"], a["unit"], str(a["size"]), str(a["used"]),
             str(a["borrowed_out"]), str(a["borrowed_in"]), str(a["queued"])]
            for a in result["arrays"]]
    text = render_table(["ARRAY", "KIND", "UNIT", "SIZE", "USED", "LENT", "BORROWED", "QUEUED"],
                        rows)
    last, change = result.get("last_resize"), result.get("last_change")
    if last:
        text += (f"\nLast re-size {_fmt_time(last['time'])} from {last['jobs']} job(s): "
                 + ("changed" if last["changed"] else "unchanged"))
    if change and change != last:
        text += f"; sizes last changed {_fmt_time(change['time'])}"
    return text
