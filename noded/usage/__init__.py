"""What jobs really use on this node (Liquid §4's labels) and when they enter their post phase.

- :mod:`.cgroupstat`: a job's cgroups from ``/proc/PID/cgroup`` and the kernel's CPU and memory
  accounting in them (cgroup v2 ``cpu.stat``/``memory.peak``, v1 ``cpuacct.usage``/
  ``memory.max_usage_in_bytes``), psutil's process figures where the job has no group.
- :mod:`.acctgroup`: on a hybrid host (v1 controllers, v2 mounted beside them) a v2 group per
  job that only accounts (CPU time, and the socket cgroup network counters match on it).
- :mod:`.netcount`: bytes sent and received by a job's sockets, from nftables counters on
  ``socket cgroupv2`` rules for the job's v2 group.
- :mod:`.stats`: peaks, means and standard deviations kept as samples come.
- :mod:`.phase`: Liquid's post-phase detector (GPU utilisation below 15% after above it).
- :mod:`.collector`: the loop sampling every running part and sending ``job_usage`` and
  ``job_phase`` events.
"""
