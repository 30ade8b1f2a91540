"""Where the collective code of the executor lives now (this module only re-exports it, for old imports).

The collectives are op handlers (:mod:`executor.handlers`), each given the rank's
:class:`executor.state.RankState`: tensor- and context-parallel cuts in :mod:`executor.handlers.blockcomm`
(mapped by :mod:`executor.cutplan`), gradient synchronisation in :mod:`executor.handlers.gradsync`, ZeRO-3 in
:mod:`executor.handlers.zero3`, the optimizer step and offload transfers in
:mod:`executor.handlers.optimizer`. The interpreter routes each op to them through one table
(:data:`executor.interpreter.HANDLERS`).
"""

from __future__ import annotations

from executor.cutplan import CE_PARTS, SP_GRADS_LABEL, TPPlan, phase_actions, plan_tp_collectives
from executor.handlers.gradsync import tied_twin
from executor.handlers.optimizer import optimizer_step, transfer
from executor.handlers.zero3 import release_zero3

__all__ = ["CE_PARTS", "SP_GRADS_LABEL", "TPPlan", "optimizer_step", "phase_actions", "plan_tp_collectives",
           "release_zero3", "tied_twin", "transfer"]
