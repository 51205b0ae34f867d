"""Image jobs at submission: the image reference must parse and mounts need an image.

What an image job may do on a node (mounts under its allowed prefixes, credentials, the
image cache) is the node's to decide (noded/containers); the master refuses at submission
only what no node could run, with one sentence. Placement does not prefer nodes that already
hold the image: no policy weighs it (docs/containers.md says why).
"""

from __future__ import annotations

from masterd.core.scheduler import JobError
from masterd.runtime.context import FeatureContext
from shared.imageref import ImageRefError, parse_image
from shared.model import JobSpec


def check_launch(spec: JobSpec) -> None:
    """Raise JobError (bad_image / bad_mount) for a launch no node could run."""
    launch = spec.launch
    if launch.image is not None:
        try:
            parse_image(launch.image)
        except ImageRefError as exc:
            raise JobError("bad_image", str(exc)) from None
    for mount in launch.mounts:
        if launch.image is None:
            raise JobError("bad_mount", "mounts apply only to a job with an image "
                                        f"(mount {mount.source}:{mount.target})")
        if not mount.source.startswith("/") or not mount.target.startswith("/"):
            raise JobError("bad_mount", f"mount {mount.source}:{mount.target}: both paths "
                                        "must be absolute")


class Containers:
    def __init__(self, ctx: FeatureContext) -> None:
        ctx.events.submitting.subscribe(check_launch)
