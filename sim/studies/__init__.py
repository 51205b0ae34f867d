"""The studies of ``trellis-sim report``, one module per paper; ``sim.results`` drives them.

- ``common``: what the studies share — :class:`~sim.studies.common.Study` (what a module
  registers), :class:`~sim.studies.common.Section` (its part of ``results.md``),
  ``ReportError``, the notes check, the replay helper, queueing statistics, plot helpers and
  the policies' display names (``POLICY_TITLES``).
- ``genie``: the GENIE workload (GENIE §7.1–7.2).
- ``philly``: the Philly trace as Helios replayed it (Helios §4.2.3, Tables 3–4).
- ``ces``: Cluster Energy Saving on Philly's node activity (Helios §4.3, Table 5).
- ``openb``: SODA (§VI) on its published workload (``soda_paper``) and the openb trace.
- ``liquid``: Liquid's testbed in batch mode, its resource model on measured data, and GPU
  sharing on openb with fractional requests honoured (Liquid §7).
- ``sched2``: SCHED²'s learned selection on Philly resampled to its workload (§IV).
- ``tenants``: Philly's virtual clusters as accounts sharing one cluster, without quotas,
  with hard quotas and with quotas + borrowing (docs/governance.md).

Each study module owns its configuration dataclass, the paper's figures it quotes, its run
function and its plots, and ends with ``STUDY = Study(...)``. The report runs the studies of
:data:`REGISTRY` in its order and numbers their headings by their place in it.

To add a study:

1. Write ``sim/studies/<name>.py`` (start from the smallest existing one): a frozen
   configuration dataclass whose defaults are the full study; ``tiny()``, a configuration
   that runs in seconds on the tests' tiny traces; ``run(config, trace_dir, out_dir, show)``
   returning ``Section("<name>", "<heading without its number>")`` filled with generated
   text, :class:`~sim.tables.Table` objects, figures written into ``out_dir`` and
   ``section.data`` for ``results.json``; optionally ``add_options(parser)`` and
   ``apply_options(config, args)`` for its own ``trellis-sim report --<name>-...`` options;
   and ``STUDY = Study(name="<name>", label=..., config=..., run=run, tiny=tiny, ...)``.
   Policy display names go into ``common.POLICY_TITLES``.
2. Add the module's ``STUDY`` to :data:`REGISTRY` below.
3. Extend ``tests/unit/test_sim_results.py``: the tiny traces ``tiny()`` reads (if new
   files), the expected headings and the end-to-end checks of its JSON.
4. Write its hand-written explanation, ``docs/results-notes/<name>.md`` (it may only state
   numbers that its generated text states), and regenerate ``docs/results.md`` with
   ``trellis-sim report``.
"""

from __future__ import annotations

from typing import Any

from sim.studies import ces, genie, liquid, openb, philly, sched2, tenants
from sim.studies.common import Study

# The report's studies, in the order of its sections.
REGISTRY: tuple[Study[Any], ...] = (genie.STUDY, philly.STUDY, ces.STUDY, openb.STUDY,
                                     sched2.STUDY, liquid.STUDY, tenants.STUDY)
