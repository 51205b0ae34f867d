"""Durable state: the SQLite store, the async journal and its writer process, the encoded
(wire) forms of jobs, and the small tables features keep (core history, services, models).

May import ``shared`` and ``masterd.core``: the journal knows jobs and rows, not features.
"""
