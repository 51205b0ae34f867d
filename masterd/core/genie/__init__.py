"""GENIE: QoS-aware scheduling of DL tasks on a GPU cluster (seeds/genie.md §5–7).

- ``model``: the processing-rate / latency prediction model (Eq. 4–8).
- ``fit``: least-squares fitting of its coefficients from lightweight profiling runs (§5.1.5).
- ``modeldb``: coefficients per (model type, GPU model) with similarity fallback (§6).
- ``qos``: expected completion times, cost, CER, waiting allowance (Eq. 9–13).
- ``plan``: each job's candidate placements on the current platform, shared by the policies.
- ``options``: a policy's configuration options -> model database and settings.
- ``freepool``: lazy free-resource pool and per-GPU-model free index for fast passes.
- ``metrics``: QoS-guarantee percentage, makespan, normalised latency (Eq. 14–16).

Everything here is synchronous and deterministic; time always comes in as ``now``.
"""
