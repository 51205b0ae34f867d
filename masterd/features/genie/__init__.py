"""GENIE in the live master: the model database (journalled), the lightweight profiler that
fills it, and the per-job prediction ``trellisctl show`` prints (seeds/genie.md §5–6).

Imports as any feature does (see ``masterd.features``).
"""
