"""How much slower a job runs spread over servers: SCHED²'s locality form (seeds/sched2.md §II-A).

The paper measures one shape only: a 4-GPU job over two servers instead of one runs ``R``
times slower (VGG16 5.9, Transformer 2.7, DeepSpeech 1.6, Inception3 1.4). Every other shape
needs a form, and GENIE's Eq. 8 is the wrong one here: it charges communication in absolute
GPU-equivalents, so a γ fitted to 5.9× at 4 GPUs eats a 2-GPU job whole (a 15× slowdown at
the 5% floor) and inverts the paper's order of the models.

The form used (for the simulator's truth of SCHED²'s models, and for the agent's profiles):

    slowdown(R, s) = 1 + (R − 1) · 2(s − 1) / s

for a job on ``s`` servers. Why: a data-parallel step is compute plus gradient exchange; on
one server the exchange rides the intra-server links and is all but free next to the network,
so the time lost over ``s`` servers is the inter-server part of a hierarchical all-reduce,
whose volume per server is 2(s − 1)/s times the gradient size (reduce-scatter plus
all-gather over ``s`` parties; Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms",
JPDC 2009), and which takes the same share of the step for a given model. The factor is 1 at
``s = 2``, so the form passes through every §II-A measurement; it is 0 at one server,
increases with ``s`` and stays below 2 (a job cannot lose more than twice its two-server
loss); and since the model enters only through ``R − 1``, the models keep the paper's order
at every shape. It does not depend on the GPU count: the bottleneck is the network link a
server has, whatever number of GPUs share it. A modelling assumption, stated as one.
"""

from __future__ import annotations


def spread_factor(servers: int) -> float:
    """The inter-server share of a step over ``servers`` servers, 1.0 at two servers."""
    s = max(1, servers)
    return 2.0 * (s - 1) / s


def spread_slowdown(two_server_slowdown: float, servers: int) -> float:
    """How many times slower a job is on ``servers`` servers than on one, given how many
    times slower it is on two (``R`` of §II-A)."""
    if not two_server_slowdown >= 1.0:
        raise ValueError(f"a two-server slowdown must be >= 1, got {two_server_slowdown!r}")
    return 1.0 + (two_server_slowdown - 1.0) * spread_factor(servers)
