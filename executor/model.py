"""A real decoder-only transformer built from a :class:`ModelSpec`, split into the IR's sub-blocks.

Block numbering follows :mod:`simgrid.ir.ops`: 0 embedding (+ learned positions), ``1 + 2i`` attention of
layer ``i`` (pre-norm included), ``2 + 2i`` MLP of layer ``i`` (pre-norm included), ``2L + 1`` final norm,
output head and cross-entropy loss. Each block is a module with its own parameters whose forward is a
chain of *segments* separated by *cuts* (see :mod:`executor.tp`): segment outputs cross a cut as a fresh
leaf tensor, so a collective can sit between two compute ops and act on the real tensor.

The model layer is split by concept: :mod:`executor.weights` (full weights and their initialisation),
:mod:`executor.block` (the block base class and its parameter bookkeeping), :mod:`executor.layers` (the
embedding, attention, MLP and head blocks), :mod:`executor.moe_layers` (a MoE layer's MLP); this module builds a rank's blocks and re-exports the names
the rest of the project uses.
"""

from __future__ import annotations

import torch

from executor.block import NORM_EPS, BlockModule, SegmentInputs, owned_parameters, shard_dim
from executor.cp import CPContext
from executor.layers import ROPE_BASE, AttentionBlock, EmbedBlock, HeadBlock, MlpBlock, apply_rope, rope_cos_sin
from executor.moe_layers import EPContext, MoeBlock
from executor.tp import TPContext
from executor.weights import INIT_STD, head_index, init_weights, weight_layout
from simgrid.errors import LayoutError
from simgrid.model.spec import ModelSpec

__all__ = [
    "INIT_STD",
    "NORM_EPS",
    "ROPE_BASE",
    "AttentionBlock",
    "BlockModule",
    "EPContext",
    "EmbedBlock",
    "HeadBlock",
    "MlpBlock",
    "MoeBlock",
    "SegmentInputs",
    "apply_rope",
    "build_block",
    "build_blocks",
    "head_index",
    "init_weights",
    "owned_parameters",
    "rope_cos_sin",
    "shard_dim",
    "weight_layout",
]


def build_block(spec: ModelSpec, index: int, weights: dict[str, torch.Tensor], tp: TPContext, *,
                tied_to: EmbedBlock | None = None, flash_attention: bool = False,
                cp: CPContext | None = None, ep: EPContext | None = None) -> BlockModule:
    """The module of sub-block ``index`` with this rank's shard of ``weights`` (and its tokens under ``cp``;
    a MoE layer's experts of its expert-parallel rank ``ep``)."""
    last = head_index(spec)
    if index == 0:
        return EmbedBlock(spec, weights, tp, cp)
    if index == last:
        return HeadBlock(spec, weights, tp, tied_to=tied_to)
    if not 0 < index < last:
        raise LayoutError(f"block {index} is outside 0..{last} for model {spec.name!r}")
    layer, part = divmod(index - 1, 2)
    if part == 0:
        return AttentionBlock(spec, layer, weights, tp, flash_attention=flash_attention, cp=cp)
    if spec.moe is not None and layer >= spec.moe.first_dense_layers:
        return MoeBlock(spec, layer, weights, tp, ep)
    return MlpBlock(spec, layer, weights, tp)


def build_blocks(spec: ModelSpec, blocks: list[int], weights: dict[str, torch.Tensor],
                 tp: TPContext, *, flash_attention: bool = False,
                 cp: CPContext | None = None, ep: EPContext | None = None) -> dict[int, BlockModule]:
    """Modules for the given blocks; a tied head shares the embedding Parameter when both are local."""
    modules: dict[int, BlockModule] = {}
    for index in sorted(blocks):
        tied_to = None
        if index == head_index(spec) and spec.tied_embeddings and 0 in modules:
            embed = modules[0]
            assert isinstance(embed, EmbedBlock)
            tied_to = embed
        modules[index] = build_block(spec, index, weights, tp, tied_to=tied_to, flash_attention=flash_attention,
                                     cp=cp, ep=ep)
    return modules

