"""Expert parallelism: the dispatch and combine all-to-alls of a MoE block on its two cuts, on real tensors.

An ``ep`` collective (label ``b{block}:{fwd|bwd|recompute}``) stands for one or both cuts of a MoE block
(:mod:`executor.moe_layers`), in the order :func:`executor.cutplan.phase_actions` gives. Forward, the
dispatch moves each rank's permuted token copies to the ranks holding their experts and the combine brings
the expert outputs back; backward, the same all-to-alls move the gradients the other way. The splits are
uneven (dropless routing sends as many tokens to a rank as its experts were chosen for): gloo's
``all_to_all_single`` takes per-peer split sizes, and the dispatch first exchanges the per-expert token counts
in a small synchronous all-to-all, as Megatron-Core's dispatcher does before its token all-to-all
(``MoEAlltoAllTokenDispatcher.preprocess``). The count exchange is part of the IR's dispatch op: the simulator
prices the token all-to-all only (the counts are ``E`` integers).
"""

from __future__ import annotations

from typing import Any

from executor.blockrun import BlockRun
from executor.comm import Pending, all_to_all_counts, all_to_all_rows
from executor.handlers.blockcomm import claim_cut_actions
from executor.moe_layers import EP_DISPATCH
from executor.state import RankState
from simgrid.errors import ProgramError
from simgrid.ir.ops import Collective


def _dispatch_splits(run: BlockRun) -> tuple[list[int], list[int]]:
    """(rows sent to, rows received from) each member of the EP group by the forward dispatch."""
    counts, recv_counts = run.scratch["counts"], run.scratch["recv_counts"]
    ep = recv_counts.shape[0]
    send = [int(n) for n in counts.view(ep, -1).sum(dim=1)]
    recv = [int(n) for n in recv_counts.sum(dim=1)]
    return send, recv


def expert_parallel(state: RankState, op: Collective) -> Pending:
    """An ``ep`` collective: dispatch/combine all-to-all of a MoE block's tokens, or of their gradients."""
    group, members = state.group(op)
    run, block, mb, phase, compute_kind, chosen = claim_cut_actions(state, op)
    works: list[Any] = []
    finishers: list[tuple[Any, int, Any]] = []
    for _, cut, _ in chosen:
        dispatch = run.module.cuts[cut].forward == EP_DISPATCH
        if phase == "bwd":
            blocked = state.backward_run(block, mb, compute_kind)
            if blocked != cut:
                raise ProgramError(f"block {block} backward is at cut {blocked}, the all-to-all expects cut {cut}")
            send, recv = _dispatch_splits(run)
            # Gradients flow against the forward: the combine's come back along the dispatch's splits.
            splits = (recv, send) if dispatch else (send, recv)
            out, work = all_to_all_rows(run.backward_comm_input(cut), *splits, group)
            finishers.append((run.set_backward_comm_result, cut, out))
        else:
            with state.deferred_segments(run, "fwd"):
                blocked = run.forward()
            if blocked != cut:
                raise ProgramError(f"block {block} forward is at cut {blocked}, the all-to-all expects cut {cut}")
            if dispatch:
                counts = run.scratch["counts"]
                run.scratch["recv_counts"] = all_to_all_counts(counts, group).view(len(members), -1)
            send, recv = _dispatch_splits(run)
            out, work = all_to_all_rows(run.forward_comm_input(cut), *((send, recv) if dispatch else (recv, send)),
                                        group)
            finishers.append((run.set_forward_comm_result, cut, out))
        works.append(work)

    def complete() -> None:
        for deliver, cut_, value in finishers:
            deliver(cut_, value)

    return Pending(handle=op.handle, works=works, on_complete=complete,
                   note="token counts exchanged first (synchronous all-to-all)" if phase != "bwd" else "")
