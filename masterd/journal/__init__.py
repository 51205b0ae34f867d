"""Durable state: the SQLite store (or PostgreSQL's, with leader election and fencing: pgstore,
lease, dialect, backends), the async journal and its writer process, the encoded
(wire) forms of jobs, and the small tables features keep (core history, services, models).

May import ``shared`` and ``masterd.core``: the journal knows jobs and rows, not features.
"""
