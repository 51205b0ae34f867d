"""Image jobs' input, checked without a container: image references, mounts against the
node's prefixes, registry credentials files, podman's pull failures named, CLI options and
the master's submission check."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from control.submit import launch_options
from control.usage import UsageError
from masterd.core.scheduler import JobError
from masterd.features.containers import check_launch
from noded.containers.cache import classify
from noded.containers.credentials import CredentialsError, read_credentials
from noded.containers.mounts import MountRefused, check_mounts
from noded.containers.podman import rlimit_flags
from shared.imageref import ImageRefError, parse_image
from shared.model import JobSpec, LaunchSpec, Mount


@pytest.mark.parametrize("ref", [
    "busybox", "library/busybox:1.36", "127.0.0.1:5000/team/img:v1",
    "registry.example.com/a/b/c@sha256:" + "0" * 64, "localhost/x:latest", "a-b__c/d.e"])
def test_references_that_parse(ref: str) -> None:
    assert str(parse_image(ref)) == ref


@pytest.mark.parametrize(("ref", "words"), [
    ("", "empty"), ("Team/img", "invalid repository component 'Team'"),
    ("img:", "invalid tag"), ("img@sha256:abc", "malformed digest"),
    ("reg.io:70000/x", "invalid port 70000"), ("a b", "white space"),
    ("reg.io/", "names no repository"), ("x" * 1100, "longer than")])
def test_references_that_do_not_parse_say_why(ref: str, words: str) -> None:
    with pytest.raises(ImageRefError, match=words):
        parse_image(ref)


def test_mounts_only_under_allowed_prefixes_and_never_devices(tmp_path: Path) -> None:
    inside = tmp_path / "data"
    inside.mkdir()
    (tmp_path / "escape").symlink_to("/etc")
    ok = check_mounts((Mount(str(inside), "/d", True),), (str(tmp_path),))
    assert ok == [f"{inside}:/d:ro,nodev,nosuid"]
    with pytest.raises(MountRefused, match="outside the prefixes"):
        check_mounts((Mount("/etc", "/d"),), (str(tmp_path),))
    with pytest.raises(MountRefused, match="outside the prefixes"):  # a link leading out
        check_mounts((Mount(str(tmp_path / "escape"), "/d"),), (str(tmp_path),))
    with pytest.raises(MountRefused, match="is a device"):
        check_mounts((Mount("/dev/null", "/d"),), ("/",))
    with pytest.raises(MountRefused, match="none: \\[containers\\] allowed_mounts is empty"):
        check_mounts((Mount(str(inside), "/d"),), ())
    with pytest.raises(MountRefused, match="cannot be used"):
        check_mounts((Mount(str(tmp_path / "absent"), "/d"),), (str(tmp_path),))


def test_credentials_files_must_be_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "reg.example:5000"
    assert read_credentials(tmp_path, "reg.example:5000") is None
    path.write_text("alice:secret\n")
    path.chmod(0o640)
    with pytest.raises(CredentialsError, match="mode 0640; it must be 0600"):
        read_credentials(tmp_path, "reg.example:5000")
    path.chmod(0o600)
    assert read_credentials(tmp_path, "reg.example:5000") == ("alice", "secret")
    path.write_text("no-colon\n")
    with pytest.raises(CredentialsError, match="user:password"):
        read_credentials(tmp_path, "reg.example:5000")
    assert read_credentials(tmp_path, "../etc") is None  # not a registry host


@pytest.mark.parametrize(("stderr", "words", "retry"), [
    ("Error: initializing source docker://127.0.0.1:40117/x:v1: reading manifest v1 in "
     "127.0.0.1:40117/x: manifest unknown: manifest unknown", "does not exist", False),
    ('pinging container registry 127.0.0.1:40117: Get "https://127.0.0.1:40117/v2/": dial '
     "tcp 127.0.0.1:40117: connect: connection refused", "cannot be reached", True),
    ("reading manifest v1 in 127.0.0.1:40117/x: unauthorized: authentication required",
     "refused the node's credentials", False),
    ("writing blob: storing blob to file: write /var/tmp/x: no space left on device",
     "is full", False),
    ("Error: parsing image configuration: invalid character '<' looking for beginning of "
     "value", "not an image registry's response", False),
    ("net/http: TLS handshake timeout", "did not answer in time", True),
])
def test_pull_failures_are_named_and_only_transient_ones_retried(
        stderr: str, words: str, retry: bool) -> None:
    failed = classify(stderr, "127.0.0.1:40117/x:v1", "127.0.0.1:40117")
    assert words in str(failed) and failed.retry is retry
    assert "\n" not in str(failed)


def test_ulimits_never_exceed_the_nodes_hard_limits() -> None:
    import resource

    flags = rlimit_flags()
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(which)[1]
        for value in (f for f in flags if f.startswith(f"{name}=")):
            soft_s, hard_s = value.split("=")[1].split(":")
            assert int(soft_s) <= int(hard_s)
            assert hard == resource.RLIM_INFINITY or int(hard_s) <= hard


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"image": None, "mount": [], **kw})


def test_cli_image_and_mount_options() -> None:
    assert launch_options(_args()) == {}
    got = launch_options(_args(image="reg.io:5000/a/b:v1", mount=["/data:/d:ro", "/s:/s"]))
    assert got == {"image": "reg.io:5000/a/b:v1", "mounts": [
        {"source": "/data", "target": "/d", "read_only": True},
        {"source": "/s", "target": "/s", "read_only": False}]}
    with pytest.raises(UsageError, match="--image: image reference 'A/b'"):
        launch_options(_args(image="A/b"))
    with pytest.raises(UsageError, match="--mount needs --image"):
        launch_options(_args(mount=["/a:/b"]))
    with pytest.raises(UsageError, match="expected SRC:DST"):
        launch_options(_args(image="x", mount=["/a"]))
    with pytest.raises(UsageError, match="must be ro or rw"):
        launch_options(_args(image="x", mount=["/a:/b:rx"]))


def test_the_master_refuses_what_no_node_could_run() -> None:
    def spec(launch: LaunchSpec) -> JobSpec:
        return JobSpec(name="j", user="nobody", command=("true",), gpus=1, launch=launch)

    check_launch(spec(LaunchSpec()))
    check_launch(spec(LaunchSpec(image="reg.io/a:v1", mounts=(Mount("/a", "/b"),))))
    with pytest.raises(JobError, match="invalid repository component") as bad:
        check_launch(spec(LaunchSpec(image="Reg/A")))
    assert bad.value.code == "bad_image"
    with pytest.raises(JobError, match="only to a job with an image"):
        check_launch(spec(LaunchSpec(mounts=(Mount("/a", "/b"),))))
    with pytest.raises(JobError, match="must be absolute"):
        check_launch(spec(LaunchSpec(image="x", mounts=(Mount("a", "/b"),))))
