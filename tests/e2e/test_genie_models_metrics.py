"""End-to-end: loading prediction models from files, and the metrics channel under abuse."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from control.client import RpcError
from demo.cluster import default_job_user
from shared.model import NodeInventory
from shared.protocol import encode_frame
from shared.schema import encode
from tests.e2e.cli import ctl

ROOT = Path(__file__).resolve().parents[2]
TRAINER = str(ROOT / "demo" / "trainer.py")
USER = default_job_user()
GPU = "A100-SXM4-40GB"

MODELS_TOML = f"""
[[models]]
model_type = "file-net"
gpu_model = "{GPU}"
family = "rnn"
k0 = 50.0
k1 = 8.0
k2 = -0.02
gamma = 0.5
lam = 0.2
nu = 1.5
source = "vendor sheet 2024"
"""


def test_models_load_from_file_persist_and_predict(make_cluster, shared_dir: Path) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4, policy="swaf")
    path = shared_dir / "models.toml"
    path.write_text(MODELS_TOML)
    code, out, err = ctl(cluster, "models", "load", str(path), json_out=False)
    assert code == 0 and "loaded 1 model(s)" in out and "file-net" in out, err

    # A bad file is refused before anything is sent, naming the file and the field.
    bad = shared_dir / "bad.toml"
    bad.write_text(MODELS_TOML.replace("k1 = 8.0", 'k1 = "fast"'))
    code, _, err = ctl(cluster, "models", "load", str(bad))
    assert code == 2 and "bad.toml" in err and "k1" in err, err
    code, _, err = ctl(cluster, "models", "load", str(shared_dir / "missing.json"))
    assert code == 2 and "missing.json" in err
    # The master validates rows too (another client may not check them).
    with pytest.raises(RpcError) as refused:
        cluster.client().call("load_models", {"rows": [{"model_type": "x", "gpu_model": GPU,
                                                        "k0": 1, "k1": 1, "k2": 0,
                                                        "gamma": -1}]})
    assert refused.value.code == "invalid_params" and "gamma" in refused.value.message
    with pytest.raises(RpcError) as refused:
        cluster.client().call("load_models", {})
    assert "path" in refused.value.message

    # A file on the master's host, by path.
    other = shared_dir / "more.json"
    other.write_text(json.dumps({"models": [{
        "model_type": "json-net", "gpu_model": GPU, "k0": 10.0, "k1": 2.0, "k2": 0.0}]}))
    result = cluster.client().call("load_models", {"path": str(other)})
    assert result["loaded"] == 1

    job = ctl(cluster, "submit", "--user", USER, "--gpus", "1", "--model-type", "File_Net",
              "--batch", "16", "--iterations", "5", "--", "python3", TRAINER, "--iterations",
              "2", "--gpu-ms", "5")[1]["job"]["id"]
    code, shown, err = ctl(cluster, "show", job)
    assert code == 0, err
    p = shown["prediction"]
    assert p["model"]["model_type"] == "file-net" and p["fallback"] is False
    assert p["model"]["source"] == "vendor sheet 2024"
    assert p["model"]["coefficients"]["nu"] == 1.5

    # Stored in the journal: a restarted master still has both.
    cluster.restart_master()
    code, models, err = ctl(cluster, "models")
    assert code == 0, err
    stored = {m["model_type"]: m for m in models["models"] if m["stored"]}
    assert set(stored) == {"file-net", "json-net"}
    assert stored["file-net"]["family"] == "rnn" and stored["file-net"]["k2"] == -0.02

    # Pools exist only under soda-arrays: a clear error otherwise.
    code, _, err = ctl(cluster, "pools")
    assert code == 1 and "not_supported" in err and "soda-arrays" in err


HOSTILE = r"""
import os, sys, time
path = os.environ["TRELLIS_METRICS_FILE"]
def pause():
    time.sleep(0.5)
with open(path, "ab") as f:
    f.write(b"\x00\xff\xfe garbage\nsamples_per_sec nan\nsamples_per_sec -1\n"
            b"samples_per_sec inf\nsamples_per_sec 1e400\n" + b"9" * 100000 + b"\n"
            b"Samples_Per_Sec 3\nsamples_per_sec 12.5\n")
pause()
os.remove(path); os.symlink("/etc/shadow", path); pause()
os.remove(path); os.mkfifo(path); pause()
os.remove(path)
with open(path, "a") as f:
    for i in range(20):
        f.write(f"metric_{i} {i}\n")
    f.write("samples_per_sec 123.5\n")
pause()
with open(path, "a") as f:
    for i in range(300000):
        f.write("samples_per_sec 7\n")
    f.write("samples_per_sec 99\n")
pause(); pause()
print("hostile done", flush=True)
"""


def test_metrics_channel_survives_hostile_jobs(make_cluster, shared_dir: Path) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=2, policy="fifo",
                           extra_node={1: {"job_metrics_interval_s": 0.2}})
    script = shared_dir / "hostile.py"
    script.write_text(HOSTILE)
    script.chmod(0o644)
    code, out, err = ctl(cluster, "submit", "--user", USER, "--gpus", "1", "--name", "hostile",
                         "--", "python3", str(script))
    assert code == 0, err
    job_id = out["job"]["id"]
    seen: dict[str, Any] = {}

    def sample() -> bool:
        shown = ctl(cluster, "show", job_id)[1]
        for name, m in shown["metrics"].items():
            seen.setdefault(name, []).append(m["last"])
        return shown["job"]["state"] in ("finished", "failed")

    cluster.wait_for("the hostile job", sample, timeout=60)
    shown = ctl(cluster, "show", job_id)[1]
    assert shown["job"]["state"] == "finished", shown["job"]
    node = cluster.node_daemons[cluster.node_name(1)]
    assert node.running, cluster.log(cluster.node_name(1))
    nodes = ctl(cluster, "nodes")[1]["nodes"]
    assert nodes[0]["status"] == "ready"
    values = seen.get("samples_per_sec", [])
    assert values and all(math.isfinite(v) and v >= 0 for v in values), seen
    # Only well-formed lines got through: 12.5, 123.5, the flood's 7 and its final 99.
    assert set(values) <= {12.5, 123.5, 7.0, 99.0}, values
    assert values[-1] == 99.0, values
    metrics = shown["metrics"]
    assert len(metrics) <= 8, metrics  # at most MAX_NAMES names per job
    # The flood was read in bounded slices: most of its 300,000 lines were skipped.
    assert metrics["samples_per_sec"]["count"] < 100_000, metrics
    log = (cluster.root / f"{cluster.node_name(1)}.log").read_text()
    assert "metrics_lines_skipped" in log


async def _node_exchange(url: str, frames: list[bytes]) -> list[Any]:
    replies: list[Any] = []
    async with aiohttp.ClientSession() as s, s.ws_connect(url + "/v1/node") as ws:
        for frame in frames:
            await ws.send_bytes(frame)
        deadline = time.monotonic() + 5
        while len(replies) < len(frames) and time.monotonic() < deadline:
            msg = await ws.receive(timeout=deadline - time.monotonic())
            if msg.type != aiohttp.WSMsgType.BINARY:
                break
            replies.append(msgpack.unpackb(msg.data))
    return replies


def test_master_validates_job_metric_events(make_cluster) -> None:
    cluster = make_cluster(nodes=0)
    inventory = encode(NodeInventory(name="trellis-test-fake", hostname="h",
                                     address="127.0.0.1", memory_mib=1))
    metric = {"job_id": "nope", "name": "samples_per_sec", "value": 1.0, "last": 1.0,
              "count": 1}
    frames = [
        encode_frame("hello", 1, {"inventory": inventory}),
        encode_frame("job_metric", 3, dict(metric, value=-1.0)),
        encode_frame("job_metric", 5, dict(metric, value=float("nan"))),
        encode_frame("job_metric", 7, dict(metric, name="Bad Name")),
        encode_frame("job_metric", 9, dict(metric, job_id="../etc")),
        encode_frame("job_metric", 11, dict(metric, count=0)),
        encode_frame("job_metric", 13, metric),  # well-formed, for a job it does not run
    ]
    replies = asyncio.run(_node_exchange(cluster.url, frames))
    by_id = {r["id"]: r for r in replies}
    assert by_id[1]["type"] == "ack"
    for bad in (3, 5, 7, 9, 11):
        assert by_id[bad]["type"] == "error", by_id[bad]
        assert by_id[bad]["body"]["code"] == "invalid_message"
    assert by_id[13]["type"] == "ack"  # accepted on the wire, dropped: not that node's job
    assert cluster.client().call("ping")["version"]
