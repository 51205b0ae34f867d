"""The master itself: drives the scheduling core from real events, carries out its decisions
on the nodes, journals every step, and hosts the features behind ``masterd.runtime``.

May import ``masterd.features``, ``masterd.runtime``, ``masterd.journal``, ``masterd.core``
and ``shared``; never ``masterd.api``.
"""
