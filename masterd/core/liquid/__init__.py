"""Liquid's scheduling core (seeds/liquid.md §5–6), pure and deterministic.

- :mod:`.demand`: a job's tasks (one worker per GPU, one parameter server for a multi-GPU
  training job) and what each needs, from the predictions features attach to jobs.
- :mod:`.network`: the distance between two nodes (1 same rack, 4 same domain, 40 otherwise).
- :mod:`.score`: a plan's score, Eq. 3–6 as Liquid's code computes it.
- :mod:`.nodes`: the nodes a pass may use, as counts the algorithms change cheaply.
- :mod:`.bestfit`: immediate mode, Algorithm 1.
- :mod:`.ga`: batch mode, the grouping genetic algorithm (Eq. 7–8).
- :mod:`.batch`: which multi-task jobs form a batch (the arrival window).
- :mod:`.sharing`: fine-grained GPU sharing and pre-scheduling eligibility (§6.1–6.2).

The policy that puts them together is :mod:`masterd.core.policies.liquid`.
"""
