"""The master's features, one module or package each (GENIE's models and profiler, SODA's
arrays, inference placer and adaptive CPUs, the metrics channel, ...).

A feature sees the master only through ``masterd.runtime.FeatureContext`` and subscribes to
its events; it may import ``shared``, ``masterd.core``, ``masterd.journal`` and
``masterd.runtime``, and another feature's public names, never ``masterd.service`` or
``masterd.api``.
"""
