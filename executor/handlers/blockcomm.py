"""Tensor- and context-parallel collectives on the cuts of one block, performed on the real tensors.

Tensor parallel (purpose ``tp``, label ``b{block}:{fwd|bwd|recompute}``): the collective moves the
tensors of the cut(s) :mod:`executor.cutplan` assigns to it, at the point the IR places it; the block's
run then continues from the delivered result at the WAIT. Sequence parallelism's backward
*input-regather* all-gathers the real norm-output shard; the executor keeps the gathered copy in the
autograd graph, so the regathered tensor is not used (the trace row notes it). The head's loss cut is
three all-reduces (Megatron's ``_VocabParallelCrossEntropy``). Sequence parallelism's partial-gradient
all-reduce has purpose ``tp`` too but belongs to the gradient synchronisation (:mod:`.gradsync`).

Context parallel (purpose ``cp``, same labels): the K/V all-gather, re-gather and dK/dV reduce-scatter of
an attention block's K/V cut (:mod:`executor.cp`, Llama 3's all-gather context parallelism).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from executor.blockrun import BlockRun
from executor.comm import Pending, all_gather_dim0, all_reduce, group_rank, reduce_scatter_dim0
from executor.cp import REGATHER_NOTE, start_kv_gather, start_kv_grad_scatter, start_kv_regather
from executor.cutplan import CE_PARTS, SP_GRADS_LABEL, Action, phase_actions
from executor.handlers.gradsync import sp_grads
from executor.state import RankState
from simgrid.errors import ProgramError
from simgrid.ir.ops import Collective


def tensor_parallel(state: RankState, op: Collective) -> Pending:
    """A ``tp`` collective: on its block's cuts, or (``s<stage>:sp-grads``) the partial-gradient sum."""
    group, members = state.group(op)
    sp = SP_GRADS_LABEL.fullmatch(op.label)
    if sp:
        return sp_grads(state, op, int(sp.group(1)), group)
    return _block_collective(state, op, group, members)


def context_parallel(state: RankState, op: Collective) -> Pending:
    """A ``cp`` collective: K/V all-gather, re-gather or dK/dV reduce-scatter of an attention block."""
    group, members = state.group(op)
    return _block_collective(state, op, group, members)


def claim_cut_actions(state: RankState, op: Collective) -> tuple[BlockRun, int, int, str, str, list[Action]]:
    """The run and the cut actions a block collective stands for: (run, block, micro-batch, phase, compute
    kind of the anchoring op, actions), consuming them from the rank's cut plan (:mod:`executor.cutplan`)."""
    block, mb, phase, compute_kind = state.tp_plan.anchors[state.current_index]
    key = (block, mb, phase, op.purpose)
    # Segments this issue runs (sequence parallelism's and context parallelism's gathers come *before*
    # the compute op) belong to the anchoring compute op, which may come later in the IR: trace them as it.
    state.segment_owner[(block, mb, "bwd" if phase == "bwd" else "fwd")] = \
        state.tp_plan.anchor_ops[state.current_index]
    if phase == "bwd":
        run = state.runs.get((block, mb))
        if run is None:
            raise ProgramError(f"backward collective of block {block} micro-batch {mb} before its forward")
    else:
        run = state.forward_run(block, mb)
        if phase == "recompute" and not run.recomputing:
            run.start_recompute(fresh_collectives=True)
    actions = phase_actions(run.module, phase, state.tp.sequence_parallel, op.purpose)
    pos = state.tp_plan.cursor[key]
    chosen: list[Action] = []
    weight = 0
    while weight < op.count and pos < len(actions):
        chosen.append(actions[pos])
        weight += 1
        pos += 1
    state.tp_plan.cursor[key] = pos
    if weight != op.count or any(a[2] != op.kind for a in chosen):
        raise ProgramError(
            f"cannot map {op.kind} x{op.count} onto block {block} ({phase}): the block expects "
            f"{[a[2] for a in actions]} and {pos - len(chosen)} were already issued"
        )
    return run, block, mb, phase, compute_kind, chosen


def _block_collective(state: RankState, op: Collective, group: Any, members: tuple[int, ...]) -> Pending:
    """A tensor- or context-parallel collective on the cut(s) of its block it stands for."""
    run, block, mb, phase, compute_kind, chosen = claim_cut_actions(state, op)
    size, index_in_group = len(members), group_rank(members, state.rank)
    works: list[Any] = []
    finishers: list[Any] = []
    notes: list[str] = []
    for kind_, cut, coll in chosen:
        if op.purpose == "cp":
            work, finisher, note = _kv_collective(state, run, (kind_, cut), phase, compute_kind, group,
                                                       index_in_group)
            works.append(work)
            if finisher is not None:
                finishers.append(finisher)
            notes += [note] if note else []
            continue
        if phase == "bwd":
            blocked = state.backward_run(block, mb, compute_kind)
            if kind_ == "regather":
                shard = run.outputs[0]
                assert shard is not None
                _, work = all_gather_dim0(shard.detach(), group, size)
                works.append(work)
                notes.append("input-regather moved; gathered copy kept from forward")
                continue
            if blocked != cut:
                raise ProgramError(f"block {block} backward is at cut {blocked}, collective expects cut {cut}")
            tensor = run.backward_comm_input(cut)
            deliver = run.set_backward_comm_result
        else:
            with state.deferred_segments(run, "fwd"):
                blocked = run.forward()
            if blocked != cut:
                raise ProgramError(f"block {block} forward is at cut {blocked}, collective expects cut {cut}")
            if kind_ in CE_PARTS:
                work, finish = _cross_entropy_part(kind_, run, cut, group)
                works.append(work)
                finishers.append((lambda _c, _v: None, cut, finish))
                continue
            tensor = run.forward_comm_input(cut)
            deliver = run.set_forward_comm_result
        work, finish, note = _start(coll, tensor, group, size, index_in_group, state)
        works += [w for w in (work,) if w is not None]
        finishers.append((deliver, cut, finish))
        if note:
            notes.append(note)

    def complete() -> None:
        for deliver_, cut_, finish_ in finishers:
            deliver_(cut_, finish_())

    return Pending(handle=op.handle, works=works, on_complete=complete, note="; ".join(notes))


def _start(kind: str, tensor: torch.Tensor, group: Any, size: int, index: int, state: RankState
           ) -> tuple[Any, Any, str]:
    """Issue one cut collective: (work, result getter, note)."""
    if kind == "all_reduce":
        return all_reduce(tensor, group), (lambda: tensor), ""
    if kind == "all_gather":
        out, work = all_gather_dim0(tensor, group, size)
        return work, (lambda: out), ""
    if kind == "reduce_scatter":
        getter, work, note = reduce_scatter_dim0(tensor, group, size, index, state.backend)
        return work, getter, note
    raise ProgramError(f"cut collective {kind!r} is not supported")


def _cross_entropy_part(part: str, run: BlockRun, cut: int, group: Any) -> tuple[Any, Any]:
    """One of the three cross-entropy all-reduces (Megatron ``_VocabParallelCrossEntropy``)."""
    logits = run.forward_comm_input(cut)
    scratch: dict[str, Any] = run.__dict__.setdefault("ce_parts", {})
    module: Any = run.module
    targets = run.targets
    assert targets is not None
    if part == "ce_max":
        value = logits.max(dim=-1).values.contiguous()
        work = dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group, async_op=True)
        scratch["max_work"] = work
    elif part == "ce_target":
        local = targets - module.vocab_start
        held = (local >= 0) & (local < logits.shape[-1])
        picked = logits.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        value = torch.where(held, picked, torch.zeros_like(picked)).contiguous()
        work = all_reduce(value, group)
    else:
        scratch.pop("max_work").wait()  # the global max must be known (already waited unless folded)
        value = (logits - scratch["max"].unsqueeze(-1)).exp().sum(dim=-1).contiguous()
        work = all_reduce(value, group)
    if part == "ce_max":
        scratch["max"] = value

    def finish() -> None:
        if part == "ce_target":
            scratch["target"] = value
        elif part == "ce_sumexp":
            stats = torch.stack([scratch.pop("max"), scratch.pop("target"), value])
            run.set_forward_comm_result(cut, stats)

    return work, finish


def _kv_collective(state: RankState, run: BlockRun, action: tuple[str, int], phase: str,
                   compute_kind: str, group: Any, index: int) -> tuple[Any, Any, str]:
    """Issue one K/V collective of a block's K/V cut: (work, (deliver, cut, result getter) or None, note).

    ``action`` is (``cut`` or ``regather``, cut index) from the rank's cut plan (:mod:`executor.cutplan`); ``index``
    is this rank's place in the CP group (the reduce-scatter shard it keeps).

    The backward re-gather moves the rank's K, V rows but does not advance the backward: the core's
    backward belongs to the B/I op after it.
    """
    block, mb, q_width = run.module.index, run.microbatch, run.module.q_width
    kind, cut = action
    if kind == "regather":
        packed = run.outputs[cut]
        if packed is None:
            raise ProgramError(f"block {block} micro-batch {mb}: K/V re-gather before the forward projected them")
        return start_kv_regather(packed.detach(), q_width, state.cp, group), None, REGATHER_NOTE
    if phase == "bwd":
        blocked = state.backward_run(block, mb, compute_kind)
        if blocked != cut:
            raise ProgramError(f"block {block} backward is at cut {blocked}, the dK/dV reduce-scatter expects {cut}")
        packed = run.outputs[cut]
        assert packed is not None
        work, grad, note = start_kv_grad_scatter(run.backward_comm_input(cut), packed.shape, q_width, state.cp,
                                                 group, index, state.backend)
        return work, (run.set_backward_comm_result, cut, grad), note
    with state.deferred_segments(run, "fwd"):
        blocked = run.forward()
    if blocked != cut:
        raise ProgramError(f"block {block} forward is at cut {blocked}, the K/V all-gather expects cut {cut}")
    work, leaf = start_kv_gather(run.forward_comm_input(cut), q_width, state.cp, group)
    return work, (run.set_forward_comm_result, cut, leaf), ""
