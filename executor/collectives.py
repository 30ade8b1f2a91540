"""Each IR collective (and host transfer) performed on the real tensors it stands for.

Tensor parallel (purpose ``tp``, label ``b{block}:{fwd|bwd|recompute}``): the k-th TP collective of a
(block, micro-batch, phase) is mapped onto the k-th entry of the block's cut plan (:class:`TPPlan`), built
from the block's cuts exactly as :mod:`simgrid.model.comm` lists Megatron's collectives, including the
folding of same-position collectives into one op with ``count > 1``. The micro-batch comes from the
nearest compute op on the same block and phase. Sequence parallelism's backward *input-regather*
all-gathers the real norm-output shard; the executor keeps the gathered copy in the autograd graph, so
the regathered tensor is not used (the trace row notes it).

Context parallel (purpose ``cp``, same labels): the K/V all-gather, re-gather and dK/dV reduce-scatter of
an attention block map onto its K/V cut the same way (:mod:`executor.cp`).

Gradient synchronisation (``dp-grad``, ``zero-grad``, ``ps-reduce``, ``embed-grad``), parameter gathers
(``zero-param``, ``ps-broadcast``) and the optimizer step act on :class:`executor.grads.GradBook`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from executor.comm import Pending, all_gather_dim0, all_reduce, flatten, group_rank, reduce_scatter_dim0
from executor.cp import CP_KV, issue_kv_collective
from executor.grads import block_parameters
from executor.tp import VOCAB_CE
from simgrid.errors import ProgramError
from simgrid.ir.ops import Collective, Compute, Transfer
from simgrid.schedules.buckets import grad_buckets

if TYPE_CHECKING:
    from executor.blockrun import BlockRun
    from executor.interpreter import RankInterpreter

Action = tuple[str, int, str]
SP_GRADS_LABEL = re.compile(r"s(\d+):sp-grads")
"""(``cut`` or ``regather``, cut index, collective kind)."""


@dataclass
class TPPlan:
    """Where each tensor-parallel collective of the rank's program lands."""

    anchors: dict[int, tuple[int, int, str, str]] = field(default_factory=dict)
    """Op index -> (block, micro-batch, phase, compute kind of the anchoring op)."""
    anchor_ops: dict[int, int] = field(default_factory=dict)
    """Op index -> index of the anchoring compute op (owns the segments the collective's issue runs)."""
    phases: set[tuple[int, int, str]] = field(default_factory=set)
    """(block, micro-batch, phase) that have TP or CP collectives."""
    cursor: dict[tuple[int, int, str, str], int] = field(default_factory=lambda: defaultdict(int))
    """Actions consumed so far per (block, micro-batch, phase, purpose) in the current step."""


def phase_actions(run_module: Any, phase: str, sequence_parallel: bool, purpose: str = "tp") -> list[Action]:
    """The ``purpose`` (``tp`` or ``cp``) collectives a block needs in ``phase``, in issue order (Megatron's
    order for tp, see simgrid.model.comm; Llama 3's K/V gather, re-gather and dK/dV scatter for cp)."""
    cuts = run_module.cuts
    if purpose == "cp":
        kv = [j for j, c in enumerate(cuts) if c.forward == CP_KV]
        if phase in ("fwd", "recompute"):
            return [("cut", j, "all_gather") for j in kv]
        return [a for j in kv for a in (("regather", j, "all_gather"), ("cut", j, "reduce_scatter"))]
    if phase in ("fwd", "recompute"):
        out: list[Action] = []
        for j, c in enumerate(cuts):
            if c.forward == VOCAB_CE:
                # Megatron's order: logit max, target logit, sum of exponentials (simgrid.model.comm).
                out += [(part, j, "all_reduce") for part in CE_PARTS]
            elif c.forward is not None and c.forward != CP_KV:
                out.append(("cut", j, c.forward))
        return out
    actions: list[Action] = [("cut", j, c.backward) for j, c in reversed(list(enumerate(cuts)))
                             if c.backward is not None and c.backward != CP_KV]
    if sequence_parallel and cuts and cuts[0].forward == "all_gather":
        # Megatron re-gathers the sequence-sharded input of the column-parallel linear for the weight
        # gradient, issued together with the output-gradient all-gather, before the backward.
        gathers = [a for a in actions if a[2] == "all_gather"]
        rest = [a for a in actions if a[2] != "all_gather"]
        actions = [*gathers, ("regather", 0, "all_gather"), *rest]
    return actions


CE_PARTS = ("ce_max", "ce_target", "ce_sumexp")
"""The three all-reduces of the vocabulary-parallel cross entropy, in issue order."""


def plan_tp_collectives(interp: RankInterpreter) -> TPPlan:
    """Anchor every TP and CP collective of the rank's program to its block, micro-batch and phase."""
    plan = TPPlan()
    ops = interp.ops
    computes = [(i, op) for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind != "OPT"]
    for index, op in enumerate(ops):
        if not (isinstance(op, Collective) and op.purpose in ("tp", "cp")) or SP_GRADS_LABEL.fullmatch(op.label):
            continue
        match = re.fullmatch(r"b(\d+):(fwd|bwd|recompute)", op.label)
        if match is None:
            raise ProgramError(f"{op.purpose} collective label {op.label!r} is not 'b<block>:<fwd|bwd|recompute>'")
        block, phase = int(match.group(1)), match.group(2)
        kinds = {"fwd": ("F",), "recompute": ("R",), "bwd": ("B", "I")}[phase]
        near = [(abs(i - index), i, c) for i, c in computes
                if c.kind in kinds and c.block_start <= block < c.block_end]
        if not near:
            raise ProgramError(f"{op.purpose} collective {op.label!r} has no {'/'.join(kinds)} op on block {block}")
        _, anchor_index, anchor = min(near, key=lambda t: (t[0], t[1]))
        plan.anchors[index] = (block, anchor.microbatch, phase, anchor.kind)
        plan.anchor_ops[index] = anchor_index
        plan.phases.add((block, anchor.microbatch, phase))
    return plan


def issue(interp: RankInterpreter, op: Collective) -> Pending:
    """Start the collective ``op`` on real tensors; the returned :class:`Pending` completes at its WAIT."""
    group = interp.ctx.groups.get(op.group)
    members = interp.ctx.members.get(op.group)
    if group is None or members is None:
        raise ProgramError(f"group {op.group!r} is unknown or does not contain rank {interp.rank}")
    if op.purpose == "tp":
        sp_grads = SP_GRADS_LABEL.fullmatch(op.label)
        if sp_grads:
            return _sp_grads(interp, op, int(sp_grads.group(1)), group)
        return _block_collective(interp, op, group, members)
    if op.purpose == "cp":  # context parallelism's K/V collectives (executor.cp)
        return _block_collective(interp, op, group, members)
    label = op.label
    if op.purpose in ("dp-grad", "zero-grad", "ps-reduce", "zero-param", "ps-broadcast"):
        zero3 = re.fullmatch(r"(b\d+(?:\+b\d+)*):(param|grad)", label)
        if zero3:
            blocks = tuple(int(b) for b in re.findall(r"\d+", zero3.group(1)))
            return _zero3(interp, op, blocks, group, members)
        bucket = re.fullmatch(r"s(\d+):bucket(\d+)", label)
        if bucket is None:
            raise ProgramError(f"{op.purpose} collective label {label!r} is not 's<stage>:bucket<i>' or 'b<block>:...'")
        return _bucket(interp, op, int(bucket.group(1)), int(bucket.group(2)), group, members)
    if op.purpose == "embed-grad":
        return _embed_grad(interp, op, group)
    if op.kind == "barrier":
        return Pending(handle=op.handle, works=[dist.barrier(group=group, async_op=True)])
    raise ProgramError(f"collective kind {op.kind!r} with purpose {op.purpose!r} is not supported by the executor")


# -- tensor and context parallel ----------------------------------------------------------------------
def _block_collective(interp: RankInterpreter, op: Collective, group: Any, members: tuple[int, ...]) -> Pending:
    """A tensor- or context-parallel collective on the cut(s) of its block it stands for."""
    block, mb, phase, compute_kind = interp.tp_plan.anchors[interp.current_index]
    key = (block, mb, phase, op.purpose)
    # Segments this issue runs (sequence parallelism's and context parallelism's gathers come *before*
    # the compute op) belong to the anchoring compute op, which may come later in the IR: trace them as it.
    interp.segment_owner[(block, mb, "bwd" if phase == "bwd" else "fwd")] = \
        interp.tp_plan.anchor_ops[interp.current_index]
    if phase == "bwd":
        run = interp.runs.get((block, mb))
        if run is None:
            raise ProgramError(f"backward collective of block {block} micro-batch {mb} before its forward")
    else:
        run = interp.forward_run(block, mb)
        if phase == "recompute" and not run.recomputing:
            run.start_recompute(fresh_collectives=True)
    actions = phase_actions(run.module, phase, interp.tp.sequence_parallel, op.purpose)
    pos = interp.tp_plan.cursor[key]
    chosen: list[Action] = []
    weight = 0
    while weight < op.count and pos < len(actions):
        chosen.append(actions[pos])
        weight += 1
        pos += 1
    interp.tp_plan.cursor[key] = pos
    if weight != op.count or any(a[2] != op.kind for a in chosen):
        raise ProgramError(
            f"cannot map {op.kind} x{op.count} onto block {block} ({phase}): the block expects "
            f"{[a[2] for a in actions]} and {pos - len(chosen)} were already issued"
        )
    size, index_in_group = len(members), group_rank(members, interp.rank)
    works: list[Any] = []
    finishers: list[Any] = []
    notes: list[str] = []
    for kind_, cut, coll in chosen:
        if op.purpose == "cp":
            work, finisher, note = issue_kv_collective(interp, run, (kind_, cut), phase, compute_kind, group,
                                                       index_in_group)
            works.append(work)
            if finisher is not None:
                finishers.append(finisher)
            notes += [note] if note else []
            continue
        if phase == "bwd":
            blocked = interp.backward_run(block, mb, compute_kind)
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
            with interp.deferred_segments(run, "fwd"):
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
        work, finish, note = _start(coll, tensor, group, size, index_in_group, interp)
        works += [w for w in (work,) if w is not None]
        finishers.append((deliver, cut, finish))
        if note:
            notes.append(note)

    def complete() -> None:
        for deliver_, cut_, finish_ in finishers:
            deliver_(cut_, finish_())

    return Pending(handle=op.handle, works=works, on_complete=complete, note="; ".join(notes))


def _start(kind: str, tensor: torch.Tensor, group: Any, size: int, index: int, interp: RankInterpreter
           ) -> tuple[Any, Any, str]:
    """Issue one cut collective: (work, result getter, note)."""
    if kind == "all_reduce":
        return all_reduce(tensor, group), (lambda: tensor), ""
    if kind == "all_gather":
        out, work = all_gather_dim0(tensor, group, size)
        return work, (lambda: out), ""
    if kind == "reduce_scatter":
        getter, work, note = reduce_scatter_dim0(tensor, group, size, index, interp.backend)
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


# -- sequence-parallel partial gradients ---------------------------------------------------------------
def _sp_grad_slot(interp: RankInterpreter, p: nn.Parameter) -> tuple[torch.Tensor, Any]:
    """(full-size flat gradient of ``p`` as this rank holds it, function writing a reduced one back).

    Where the gradient lives at the step end: a ZeRO-3 shard, a slice of a ZeRO-1/2 bucket shard (zeros
    outside this rank's slice; tensor-parallel peers hold the same slice, so the sum stays exact), the
    data-parallel reduced accumulator, or the local ``p.grad``.
    """
    book = interp.book
    numel = p.numel()
    pshard = book.zero3.get(id(p))
    if pshard is not None:
        numel = pshard.numel  # the parameter itself is released (empty) between ZeRO-3 gathers
        lo = min(book.dp_index * pshard.shard.numel(), numel)
        hi = min(lo + pshard.shard.numel(), numel)
        full = pshard.grad.new_zeros(numel)
        full[lo:hi] = pshard.grad[: hi - lo]

        def write_shard(reduced: torch.Tensor) -> None:
            pshard.grad[: hi - lo] = reduced[lo:hi]

        return full, write_shard
    for shard in book.buckets.values():
        if any(q is p for q in shard.params):
            offset = _offset(shard.params, p)
            lo, hi = max(offset, shard.start), min(offset + numel, shard.stop)
            full = shard.grad.new_zeros(numel)
            if lo < hi:
                full[lo - offset: hi - offset] = shard.grad[lo - shard.start: hi - shard.start]

            def write_bucket(reduced: torch.Tensor, shard: Any = shard, lo: int = lo, hi: int = hi,
                             offset: int = offset) -> None:
                if lo < hi:
                    shard.grad[lo - shard.start: hi - shard.start] = reduced[lo - offset: hi - offset]

            return full, write_bucket
    if id(p) in book.reduced:
        return book.reduced[id(p)].reshape(-1).clone(), lambda reduced: book.reduced.__setitem__(
            id(p), reduced.view_as(p).clone())
    local = p.grad if p.grad is not None else torch.zeros_like(p)

    def write_local(reduced: torch.Tensor) -> None:
        p.grad = reduced.view_as(p).clone()

    return local.reshape(-1).clone(), write_local


def _sp_grads(interp: RankInterpreter, op: Collective, stage: int, group: Any) -> Pending:
    """``s<stage>:sp-grads``: sum over the TP group the gradients of the stage's sequence-parallel partial
    parameters (norms, row-parallel biases, learned positions; Megatron-LM ``_allreduce_layernorm_grads``)."""
    blocks = sorted(b for b, s in interp.stage_of.items() if s == stage)
    interp.finish_blocks(set(blocks))
    params = [p for _, p in block_parameters(interp.modules, blocks) if id(p) in interp.sp_params]
    slots = [_sp_grad_slot(interp, p) for p in params]
    flat = torch.cat([full for full, _ in slots]) if slots else torch.zeros(0)
    work = all_reduce(flat, group)

    def write_back() -> None:
        offset = 0
        for full, write in slots:
            write(flat[offset: offset + full.numel()])
            offset += full.numel()

    return Pending(handle=op.handle, works=[work], on_complete=write_back)


# -- data parallel and ZeRO ---------------------------------------------------------------------------
def _bucket_params(interp: RankInterpreter, stage: int, index: int) -> list[tuple[str, nn.Parameter]]:
    buckets = grad_buckets(interp.spec, interp.layout, stage)
    if not 0 <= index < len(buckets):
        raise ProgramError(f"stage {stage} has {len(buckets)} gradient buckets, not bucket {index}")
    blocks = list(buckets[index].blocks)
    interp.finish_blocks(set(blocks))
    return block_parameters(interp.modules, blocks)


def _bucket(interp: RankInterpreter, op: Collective, stage: int, index: int, group: Any,
            members: tuple[int, ...]) -> Pending:
    book = interp.book
    size = len(members)
    if op.purpose == "zero-param":
        found = book.buckets.get((stage, index))
        if found is None:
            raise ProgramError(f"zero-param gather of s{stage}:bucket{index} before its gradients were reduced")
        full, work = all_gather_dim0(found.master, group, size)
        return Pending(handle=op.handle, works=[work], on_complete=lambda: book.write_gathered(found, full))
    if op.purpose == "ps-broadcast":
        params = [p for _, p in block_parameters(interp.modules, _stage_bucket_blocks(interp, stage, index))]
        flat = flatten([p.detach() for p in params])
        work = dist.broadcast(flat, src=_root(op), group=group, async_op=True)

        def write() -> None:
            if interp.rank != op.root:
                book.write_flat(params, flat)

        return Pending(handle=op.handle, works=[work], on_complete=write)
    named = _bucket_params(interp, stage, index)
    params = [p for _, p in named]
    if op.purpose == "dp-grad":
        flat = book.take_local(params)
        return Pending(handle=op.handle, works=[all_reduce(flat, group)],
                       on_complete=lambda: book.add_reduced(params, flat))
    if op.purpose == "ps-reduce":
        flat = book.take_local(params)
        work = dist.reduce(flat, dst=_root(op), group=group, async_op=True)

        def keep() -> None:
            if interp.rank == op.root:
                book.add_reduced(params, flat)

        return Pending(handle=op.handle, works=[work], on_complete=keep)
    # zero-grad: reduce-scatter of the padded flat bucket.
    shard = book.bucket((stage, index), named)
    flat = flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in params], pad_to=size)
    twin = interp_tied_twin(interp)
    for p in params:
        p.grad = None
    getter, work, note = reduce_scatter_dim0(flat, group, size, group_rank(members, interp.rank), interp.backend)

    def accumulate() -> None:
        shard.grad += getter()
        if twin is not None and any(p is twin for p in params):
            # Keep the twin's full reduced gradient for the tied-embedding all-reduce that follows.
            offset = _offset(params, twin)
            full = getattr(getter, "full", None)
            if full is None:
                raise ProgramError("tied embeddings with ZeRO over NCCL need the full reduced gradient")
            book.reduced[id(twin)] = full[offset: offset + twin.numel()].view_as(twin).clone()

    return Pending(handle=op.handle, works=[work], on_complete=accumulate, note=note)


def _stage_bucket_blocks(interp: RankInterpreter, stage: int, index: int) -> list[int]:
    return list(grad_buckets(interp.spec, interp.layout, stage)[index].blocks)


def _root(op: Collective) -> int:
    if op.root is None:
        raise ProgramError(f"{op.kind} needs a root rank")
    return op.root


def _offset(params: list[nn.Parameter], target: nn.Parameter) -> int:
    offset = 0
    for p in params:
        if p is target:
            return offset
        offset += p.numel()
    raise ProgramError("parameter not in bucket")


def interp_tied_twin(interp: RankInterpreter) -> nn.Parameter | None:
    """This rank's copy of a tied embedding matrix that has a twin on another pipeline stage."""
    if not interp.spec.tied_embeddings or (0 in interp.modules and interp.head in interp.modules):
        return None
    if 0 in interp.modules:
        return interp.modules[0].wte
    if interp.head in interp.modules:
        return interp.modules[interp.head].head_weight
    return None


def _embed_grad(interp: RankInterpreter, op: Collective, group: Any) -> Pending:
    twin = interp_tied_twin(interp)
    if twin is None:
        raise ProgramError("embed-grad all-reduce on a rank without a tied embedding twin")
    blocks = {0} if 0 in interp.modules else {interp.head}
    interp.finish_blocks(blocks)
    book = interp.book
    before = book.reduced.get(id(twin))
    target = before if before is not None else twin.grad
    if target is None:
        target = torch.zeros_like(twin)
        twin.grad = target
    snapshot = target.clone()
    work = all_reduce(target, group)

    def propagate() -> None:
        # A ZeRO shard that already holds part of the twin's gradient gets the other stage's share too.
        delta = target - snapshot
        for shard in book.buckets.values():
            if any(p is twin for p in shard.params):
                offset = _offset(shard.params, twin)
                lo, hi = max(offset, shard.start), min(offset + twin.numel(), shard.stop)
                if lo < hi:
                    shard.grad[lo - shard.start: hi - shard.start] += delta.reshape(-1)[lo - offset: hi - offset]

    return Pending(handle=op.handle, works=[work], on_complete=propagate)


# -- ZeRO-3 -------------------------------------------------------------------------------------------
def _zero3(interp: RankInterpreter, op: Collective, blocks: tuple[int, ...], group: Any,
           members: tuple[int, ...]) -> Pending:
    """ZeRO-3 all-gather or reduce-scatter of the parameters the named blocks read (a gather unit of
    several blocks, or one block; a tied weight shared by two of them moves once)."""
    book = interp.book
    shards = list({id(s): s for b in blocks for s in book.zero3_params(b)}.values())
    size = len(members)
    if op.purpose == "zero-param":
        local = torch.cat([s.shard for s in shards]) if shards else torch.zeros(0)
        full, work = all_gather_dim0(local, group, size)
        interp.zero3_handles[op.handle] = blocks

        def scatter_back() -> None:
            per_rank = full.view(size, -1)
            offset = 0
            for s in shards:
                n = s.shard.numel()
                s.param.data = per_rank[:, offset: offset + n].reshape(-1)[: s.numel].view(s.shape).clone()
                offset += n
            for block in blocks:
                interp.zero3_live[block] = interp.zero3_live.get(block, 0) + 1

        return Pending(handle=op.handle, works=[work], on_complete=scatter_back,
                       note=f"includes the tied embedding ({shards[-1].name})"
                       if len(shards) > len(block_parameters(interp.modules, list(blocks))) else "")
    interp.finish_blocks(set(blocks))
    pieces = []
    for s in shards:
        g = s.param.grad if s.param.grad is not None else torch.zeros(s.shape)
        pieces.append(flatten([g], pad_to=size).view(size, -1))
        s.param.grad = None
    flat = torch.cat(pieces, dim=1).reshape(-1) if pieces else torch.zeros(0)
    getter, work, note = reduce_scatter_dim0(flat, group, size, group_rank(members, interp.rank), interp.backend)

    def accumulate() -> None:
        mine = getter()
        offset = 0
        for s in shards:
            n = s.shard.numel()
            s.grad += mine[offset: offset + n]
            offset += n

    return Pending(handle=op.handle, works=[work], on_complete=accumulate, note=note)


def release_zero3(interp: RankInterpreter, block: int) -> None:
    """FREE of a ZeRO-3 gathered buffer: drop the full parameters once no gather of the block is live.

    Segments the executor runs lazily (after a tensor-parallel cut) still read these parameters, so the
    ready ones of every block reading a released parameter run first: the IR's FREE follows that compute.
    """
    live = interp.zero3_live.get(block, 0) - 1
    interp.zero3_live[block] = live
    if live > 0:
        return
    book = interp.book
    released = [s for s in book.zero3_params(block)
                if not any(interp.zero3_live.get(b, 0) > 0 for b in interp.modules
                           if b != block and any(x is s for x in book.zero3_params(b)))]
    readers = {b for b in interp.modules if any(x is s for s in released for x in book.zero3_params(b))}
    interp.finish_ready_segments(readers)
    for s in released:
        s.param.data = torch.empty(0)


# -- offload and the optimizer ------------------------------------------------------------------------
def transfer(interp: RankInterpreter, op: Transfer) -> Pending:
    """Host <-> device copies of the optimizer offload: gradients down, parameters up."""
    match = re.fullmatch(r"s(\d+):(grads|params)", op.label)
    stage = int(match.group(1)) if match else None
    blocks = [b for b, s in interp.stage_of.items() if stage is None or s == stage]
    book = interp.book
    named = block_parameters(interp.modules, blocks)
    if op.direction == "d2h":
        interp.finish_blocks(set(blocks))
        for _, p in named:
            book.host_grads[id(p)] = book.full_grad(p).detach().to("cpu", copy=True)
            if id(p) not in book.host_params:
                book.host_params[id(p)] = p.detach().to("cpu", copy=True)
    else:
        with torch.no_grad():
            for _, p in named:
                p.copy_(book.host_params[id(p)].to(p.device))
    return Pending(handle=op.handle, works=[], note="synchronous copy")


def optimizer_step(interp: RankInterpreter, op: Compute) -> None:
    """The OPT op: update what this rank owns for the blocks of the op's range."""
    blocks = [b for b in range(op.block_start, op.block_end) if b in interp.modules]
    interp.finish_blocks(set(blocks))
    book = interp.book
    step = interp.step_index + 1
    stages = {interp.stage_of[b] for b in blocks}
    if interp.layout.zero == 3:
        book.step_zero3(blocks, step)
    elif interp.layout.zero in (1, 2) and any(k[0] in stages for k in book.buckets):
        book.step_buckets([k for k in book.buckets if k[0] in stages], step)
    elif op.device == "cpu":
        book.step_unsharded(blocks, step, host=True)
    else:
        book.step_unsharded(blocks, step)
