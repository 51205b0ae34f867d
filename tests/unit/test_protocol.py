from __future__ import annotations

import msgpack
import pytest

from shared.messages import Hello, PrepareJob
from shared.model import JobSpec, NodeAllocation, NodeInventory
from shared.protocol import (
    MAX_FRAME,
    ProtocolError,
    decode_frame,
    decode_rpc_request,
    encode_frame,
    encode_rpc_request,
    pack,
)
from shared.schema import SchemaError, decode, encode


def test_frame_round_trip() -> None:
    frame = decode_frame(encode_frame("job_started", 7, {"job_id": "a", "pid": 3}))
    assert (frame.type, frame.id, frame.body) == ("job_started", 7, {"job_id": "a", "pid": 3})


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xc1", "bad_frame"),  # never-used msgpack byte
        (b"\x92\x01", "bad_frame"),  # truncated array
        (pack([1, 2]), "bad_frame"),
        (pack({"v": 99, "type": "x", "id": 1, "body": {}}), "bad_version"),
        (pack({"v": 1, "type": "", "id": 1, "body": {}}), "bad_frame"),
        (pack({"v": 1, "type": "x", "id": -1, "body": {}}), "bad_frame"),
        (pack({"v": 1, "type": "x", "id": True, "body": {}}), "bad_frame"),
        (pack({"v": 1, "type": "x", "id": 1, "body": [1]}), "bad_frame"),
        (b"\x00" * (MAX_FRAME + 1), "frame_too_large"),
    ],
)
def test_bad_frames_name_the_problem(data: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_frame(data)
    assert info.value.code == code
    assert info.value.message


def test_deep_nesting_is_refused_not_crashing() -> None:
    data = b"\x91" * 100_000 + b"\x00"
    with pytest.raises(ProtocolError):
        decode_frame(data)


def test_rpc_request() -> None:
    req = decode_rpc_request(encode_rpc_request("jobs", {"state": "queued"}, 3))
    assert (req.id, req.method, req.params) == (3, "jobs", {"state": "queued"})
    with pytest.raises(ProtocolError, match="method"):
        decode_rpc_request(pack({"v": 1, "method": 5}))
    with pytest.raises(ProtocolError, match="params"):
        decode_rpc_request(pack({"v": 1, "method": "x", "params": [1]}))


SPEC = {"name": "train", "command": ["python", "t.py"], "user": "alice", "gpus": 2}


def test_jobspec_validation_names_fields() -> None:
    spec = decode(JobSpec, SPEC)
    assert spec.gpus == 2 and spec.command == ("python", "t.py")
    cases = [
        ({**SPEC, "gpus": -1}, "gpus: must be at least 0"),
        ({**SPEC, "gpus": "2"}, "gpus: must be an integer"),
        ({**SPEC, "name": "../etc"}, "name: '../etc' does not match"),
        ({**SPEC, "name": "a/b"}, "name: 'a/b' does not match"),
        ({**SPEC, "name": "x" * 64}, "name:"),
        ({**SPEC, "user": "Robert'); DROP"}, "user:"),
        ({**SPEC, "qos": "platinum"}, "qos: must be one of urgent, prior, normal"),
        ({**SPEC, "command": []}, "command must not be empty"),
        ({**SPEC, "kind": "cpu"}, "a cpu job cannot ask for GPUs"),
        ({**SPEC, "gpus": 0}, "a training job needs at least one GPU"),
        ({**SPEC, "colour": "red"}, "unknown field(s) 'colour'"),
        ({k: v for k, v in SPEC.items() if k != "user"}, "user: is required"),
        ({**SPEC, "name": "ok\x00"}, "name:"),
        ({**SPEC, "env": {"A=B": "x"}}, "env key"),
        ({**SPEC, "batch": 1.5}, "batch: must be an integer"),
        ({**SPEC, "deadline": float("nan")}, "deadline: must be a finite number"),
    ]
    for data, message in cases:
        with pytest.raises(SchemaError) as info:
            decode(JobSpec, data)
        assert message in str(info.value), (data, str(info.value))


def test_nested_message_round_trip() -> None:
    inv = NodeInventory(name="n1", hostname="h", address="127.0.0.1", memory_mib=10)
    hello = decode(Hello, msgpack.unpackb(pack(encode(Hello(inventory=inv)))))
    assert hello.inventory == inv
    prep = PrepareJob(job_id="j-1", spec=decode(JobSpec, SPEC),
                      allocation=NodeAllocation("n1", (0, 1), (0,), 0))
    assert decode(PrepareJob, msgpack.unpackb(pack(encode(prep)))) == prep
    with pytest.raises(SchemaError, match=r"allocation\.gpus\[1\]: must be an integer"):
        decode(PrepareJob, {**encode(prep), "allocation": {"node": "n1", "gpus": [0, "x"]}})
