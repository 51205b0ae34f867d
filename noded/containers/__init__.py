"""Jobs that run in their own OCI image (``JobSpec.launch.image``), through podman and runc.

noded (``launcher.py``) turns an image job's launch into ``python -m noded.containers.launch
JOBDIR``, which the shim runs like any job command: inside the job's cgroups, CPU affinity
and MBA group, its output through the shim's log relay, its process group signalled at stop.
That process checks the mounts, pulls the image into the node's cache (``pull.py``,
``cache.py``, credentials from ``credentials.py``) and execs ``podman run`` (``podman.py``)
with the container's cgroup nested under the job's, the job's GPUs given by a CDI spec
(``cdi.py``). See docs/containers.md.
"""
