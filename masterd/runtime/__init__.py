"""The narrow interface the master gives its features: clock, journal, a read-only view of
the core, job and node actions, supervised tasks, a worker-process runner, and events.

May import ``shared``, ``masterd.core`` and ``masterd.journal``; never a feature, the service
or the API.
"""
