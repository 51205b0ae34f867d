"""trellis-sim: a discrete-event simulator that drives masterd's scheduling core.

Nothing here re-implements scheduling: policies come from ``masterd.core.policies.REGISTRY``
and run inside the very ``SchedulingCore`` the master uses, fed with a virtual clock.
"""
