"""SODA's multi-array pools in the live master: the pools view and periodic re-sizing from
the demand of recently ended jobs (seeds/soda.md §V-C).

Imports as any feature does (see ``masterd.features``).
"""
