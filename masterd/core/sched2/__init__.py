"""SCHED² (seeds/sched2.md §III): the parts the ``sched2`` policy and its baselines share.

- ``packing``: the paper's packing placement (Fig. 2), uneven splits over servers allowed;
- ``estimate``: predicted execution times from GENIE's model database (the "profiles");
- ``state``: the agent's state (Table I) built from a cluster snapshot and the queue;
- ``network``: the Q-network's numpy forward pass over exported ``.npz`` weights (Eq. 3–5).

Pure and synchronous like the rest of ``masterd.core``; nothing here imports torch.
"""
