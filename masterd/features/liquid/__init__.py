"""Liquid in the live master (seeds/liquid.md §4, §6): what jobs really use, the resource model
learnt from it, and the post phase that lends GPUs for pre-scheduling.

- :mod:`.jobfeatures`: a job's features and a usage report's labels (pure).
- :mod:`.forest`: the random forests (fitted in a worker process, predicted with NumPy).
- :mod:`.feature`: :class:`~masterd.features.liquid.feature.LiquidResources`, the feature:
  journals ``job_usage`` reports, trains the model from the journal, attaches predictions to
  jobs (``Job.annotations``, read by ``masterd.core.policies.liquid``), and turns ``job_phase``
  events into lent GPUs.
"""
