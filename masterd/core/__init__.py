"""The scheduling core: synchronous, deterministic code shared by masterd and the simulator.

Nothing under this package awaits, sleeps, reads the wall clock or touches the network: time
comes in as ``now`` and the cluster comes in as a :class:`~masterd.core.cluster.ClusterState`.
May import ``shared`` only (and numpy; ``masterd.core.helios`` also rapidfuzz and LightGBM,
for QSSF's estimate and CES's forecaster: deterministic computation, no I/O); the rest of
masterd and the simulator import it.
"""
