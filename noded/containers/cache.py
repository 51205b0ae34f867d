"""The node's image cache: pulls (bounded in time and attempts, each failure named) and the
size cap (least recently used images go first, never one a container uses).

Runs in the job's launch process (noded/containers/launch.py), inside the job's cgroup, so
a pull is confined and metered like the job. Concurrent launches share the store: podman
locks it; the use record (``STORE/lru.json``) is updated under a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from noded.containers.podman import Podman


class PullFailed(Exception):
    """The image could not be pulled; the message is the job's reason. ``retry``: worth
    another attempt (the registry down or hanging), not a missing image or refused login."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


# podman's words for each failure (lower case) -> (the job's sentence, retry?).
_CAUSES: tuple[tuple[tuple[str, ...], str, bool], ...] = (
    (("no space left on device",), "the node's image store is full (no space left on "
     "device)", False),
    (("connection refused", "no such host", "no route to host", "network is unreachable",
      "connection reset"), "registry {registry} cannot be reached", True),
    (("unauthorized", "authentication required", "denied"),
     "registry {registry} refused the node's credentials for {image}", False),
    (("manifest unknown", "name unknown", "not found"),
     "image {image} does not exist in registry {registry}", False),
    (("i/o timeout", "timeout", "deadline exceeded"),
     "registry {registry} did not answer in time", True),
    (("invalid character", "unexpected", "malformed", "unsupported", "eof", "parse",
      "mediatype", "does not match", "http response"),
     "registry {registry} answered with something that is not an image registry's "
     "response", False),
)


def classify(stderr: str, image: str, registry: str) -> PullFailed:
    # Not the names themselves: a port or a path may hold any of the words below.
    text = stderr.replace(image, "IMAGE").replace(registry or "\0", "REGISTRY").lower()
    for words, sentence, retry in _CAUSES:
        if any(w in text for w in words):
            return PullFailed(sentence.format(image=image, registry=registry or "(default)"),
                              retry)
    last = stderr.strip().splitlines()[-1:] or ["no output"]
    return PullFailed(f"pulling {image} failed: {last[0][:300]}", False)


@dataclass
class ImageCache:
    podman: Podman
    max_bytes: int
    pull_timeout_s: float = 600.0
    pull_retries: int = 2
    # Where progress lines go (the job's log) and the pull's record (JOBDIR/pull.json).
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    record: Path | None = None
    # The job's metrics channel (noded/metrics_channel.py): the pull's progress reaches the
    # master as job_metric events, shown by ``trellisctl show`` (image_pull_*).
    metric: Callable[[str, float], None] = lambda name, value: None
    pulled: bool = False  # the last ensure() pulled (the cache grew)

    @property
    def store(self) -> Path:
        return self.podman.storage

    @property
    def pull_tmp(self) -> Path:
        """Where this process's pulls download blobs first (podman's TMPDIR): in the node's
        store, one directory per launch, so a failed pull scrubs only its own."""
        return self.store / "pull-tmp" / str(os.getpid())

    def _env(self) -> dict[str, str]:
        return {**os.environ, "TMPDIR": str(self.pull_tmp)}

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.podman.argv(*args), capture_output=True, text=True,
                              timeout=timeout)

    def image_id(self, image: str) -> str | None:
        done = self._run("image", "inspect", "--format", "{{.Id}}", image)
        return done.stdout.strip() or None if done.returncode == 0 else None

    def architecture(self, image: str) -> str:
        done = self._run("image", "inspect", "--format", "{{.Architecture}}", image)
        return done.stdout.strip()

    def _note(self, **fields: object) -> None:
        if self.record is not None:
            with contextlib.suppress(OSError):
                tmp = self.record.with_suffix(".tmp")
                tmp.write_text(json.dumps({**fields, "time": time.time()}))
                os.replace(tmp, self.record)

    def ensure(self, image: str, registry: str, authfile: Path | None, tls_verify: bool) -> str:
        """The image's id, pulled first unless the cache holds it (``self.pulled`` says
        whether it was)."""
        self.pulled = False
        cached = self.image_id(image)
        if cached is not None:
            self._note(state="cached", image=image)
            self.metric("image_cached", 1)
            return cached
        attempts = 1 + self.pull_retries
        try:
            for attempt in range(1, attempts + 1):
                try:
                    self._pull_once(image, registry, authfile, tls_verify, attempt, attempts)
                    break
                except PullFailed as exc:
                    self._scrub()
                    if not exc.retry or attempt == attempts:
                        if attempts > 1 and exc.retry:
                            raise PullFailed(f"{exc} ({attempts} attempts)", False) from None
                        raise
                    self.progress(f"[trellis] pull attempt {attempt} failed: {exc}; retrying")
                    time.sleep(min(30.0, 2.0 ** attempt))
        finally:
            shutil.rmtree(self.pull_tmp, ignore_errors=True)
        found = self.image_id(image)
        if found is None:
            raise PullFailed(f"image {image} was pulled but is not in the node's store", False)
        self.pulled = True
        return found

    def _pull_once(self, image: str, registry: str, authfile: Path | None, tls_verify: bool,
                   attempt: int, attempts: int) -> None:
        args = ["pull", f"--tls-verify={'true' if tls_verify else 'false'}"]
        if authfile is not None:
            args += ["--authfile", str(authfile)]
        self.pull_tmp.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        self._note(state="pulling", image=image, attempt=attempt, attempts=attempts, blobs=0)
        self.progress(f"[trellis] pulling {image} (attempt {attempt} of {attempts})")
        proc = subprocess.Popen(self.podman.argv(*args, image), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=self._env(),
                                start_new_session=True)
        lines: list[str] = []
        blobs = 0
        deadline = start + self.pull_timeout_s
        assert proc.stdout is not None
        with _killer(proc, deadline) as timed_out:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("Copying blob"):
                    blobs += 1
                    self.metric("image_pull_layers", blobs)
                    self.metric("image_pull_s", round(time.monotonic() - start, 3))
                    self._note(state="pulling", image=image, attempt=attempt,
                               attempts=attempts, blobs=blobs,
                               elapsed_s=round(time.monotonic() - start, 1))
                    self.progress(f"[trellis] pull {image}: layer {blobs} "
                                  f"({time.monotonic() - start:.1f}s)")
            proc.wait()
        if timed_out():
            raise PullFailed(f"pulling {image} from {registry or '(default)'} did not finish "
                             f"within {self.pull_timeout_s:g}s", True)
        if proc.returncode != 0:
            raise classify("".join(lines[-20:]), image, registry)
        self._note(state="pulled", image=image, elapsed_s=round(time.monotonic() - start, 3))
        self.metric("image_pull_s", round(time.monotonic() - start, 3))
        self.metric("image_pulled", 1)
        self.progress(f"[trellis] pulled {image} in {time.monotonic() - start:.1f}s")

    def _scrub(self) -> None:
        """Remove what a failed pull left half-written: its temporary blobs."""
        shutil.rmtree(self.pull_tmp, ignore_errors=True)

    # -- size cap ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _uses(self) -> Iterator[dict[str, float]]:
        lock = os.open(self.store / "lru.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.store / "lru.json"
            try:
                uses = json.loads(path.read_text())
            except (OSError, ValueError):
                uses = {}
            yield uses
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(uses))
            os.replace(tmp, path)
        finally:
            os.close(lock)

    def touch(self, image_id: str) -> None:
        with self._uses() as uses:
            uses[image_id] = time.time()

    def remove(self, image_id: str) -> bool:
        """Remove an image (not one a container uses: podman refuses)."""
        return self._run("rmi", image_id).returncode == 0

    def images(self) -> list[dict]:
        done = self._run("images", "--format", "json")
        if done.returncode != 0:
            return []
        return json.loads(done.stdout or "[]")

    def in_use(self) -> set[str]:
        done = self._run("ps", "--all", "--format", "{{.ImageID}}", "--no-trunc")
        return {line.strip().removeprefix("sha256:") for line in done.stdout.splitlines()
                if line.strip()}

    def evict(self, keep: str) -> list[str]:
        """Remove least recently used images until the cache fits its cap; never ``keep``
        (the image about to run) nor one any container uses. Returns the removed ids."""
        images = self.images()
        total = sum(int(i.get("Size", 0)) for i in images)
        if total <= self.max_bytes:
            return []
        busy = self.in_use() | {keep}
        removed: list[str] = []
        with self._uses() as uses:
            for image in sorted(images, key=lambda i: uses.get(i["Id"], 0.0)):
                if total <= self.max_bytes:
                    break
                if image["Id"] in busy:
                    continue
                if self.remove(image["Id"]):  # podman refuses an image a container uses
                    total -= int(image.get("Size", 0))
                    uses.pop(image["Id"], None)
                    removed.append(image["Id"])
        if removed:
            self.progress(f"[trellis] image cache over its cap: removed {len(removed)} least "
                          "recently used image(s)")
        return removed


@contextlib.contextmanager
def _killer(proc: subprocess.Popen[str], deadline: float) -> Iterator[Callable[[], bool]]:
    """Kill ``proc``'s process group at ``deadline`` (a hung registry); yields 'did it?'."""
    import threading

    fired = threading.Event()
    done = threading.Event()

    def watch() -> None:
        if not done.wait(max(0.0, deadline - time.monotonic())):
            fired.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield fired.is_set
    finally:
        done.set()
        thread.join()
