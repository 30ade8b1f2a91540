"""Sub-block numbering, tensor-parallel shapes and pipeline placement of a model.

Block numbering follows :mod:`simgrid.ir.ops`: block 0 is the embedding, block ``1 + 2*i`` the attention
sub-block of layer ``i`` (its input norm included), block ``2 + 2*i`` the MLP sub-block (its norm
included) and block ``2*L + 1`` the output head with the final norm and the loss.

Global pipeline stage ``s`` (a model chunk, ``0 .. pp*vpp - 1``) covers ``n = L / (pp*vpp)`` consecutive
layers; stage 0 also holds the embedding and the last stage the head. When ``pp*vpp`` does not divide
``L``, middle stages get ``ceil(L / (pp*vpp))`` layers and the first and last stages (which also carry the
embedding and the head) give up the remainder, one layer at a time, alternating first, last, second,
second-to-last, ... — the recipe Llama 3 used for 126 layers on 16 pipeline stages (Dubey et al. 2024,
"The Llama 3 Herd of Models", section 3.3.2: one layer fewer on the first and the last stage). Stage-to-rank placement:
the interleaved schedule puts stage ``s`` on pipeline rank ``s % pp`` (Narayanan et al. SC'21, section
2.2.2); ZBV folds the stages into a V, so rank ``r`` holds stages ``r`` and ``2*pp - 1 - r`` (Qi et al.,
"Pipeline Parallelism with Controllable Memory", 2024).
"""

from __future__ import annotations

from typing import Literal

from simgrid.errors import LayoutError, ModelError
from simgrid.layout.spec import V_SCHEDULES, Layout
from simgrid.model.spec import ModelSpec

BlockKind = Literal["embed", "attn", "mlp", "head"]


def num_model_blocks(model: ModelSpec) -> int:
    """Sub-blocks of the model: embedding, two per layer, head."""
    return 2 * model.num_layers + 2


def block_kind(model: ModelSpec, block: int) -> tuple[BlockKind, int]:
    """Kind of a sub-block and its layer index (-1 for the embedding and the head)."""
    last = 2 * model.num_layers + 1
    if not isinstance(block, int) or isinstance(block, bool) or not 0 <= block <= last:
        raise ModelError(
            f"model {model.name!r}: block = {block!r} is outside 0..{last} "
            f"(0 embedding, 1..{last - 1} layers, {last} head)"
        )
    if block == 0:
        return "embed", -1
    if block == last:
        return "head", -1
    layer, part = divmod(block - 1, 2)
    return ("attn" if part == 0 else "mlp"), layer


def norm_params(model: ModelSpec) -> int:
    """One normalisation layer: LayerNorm has a weight and a bias, RMSNorm only a weight."""
    return (2 if model.norm == "layernorm" else 1) * model.hidden_size


def local_q_heads(model: ModelSpec, tp: int) -> int:
    """Query heads on one tensor-parallel rank (Megatron splits heads evenly)."""
    return model.num_heads // tp


def local_kv_heads(model: ModelSpec, tp: int) -> int:
    """Key/value heads on one tensor-parallel rank.

    With GQA and ``tp > kv_heads`` each rank keeps one KV head, replicated over ``tp / kv_heads`` ranks
    (Megatron-LM ``num_query_groups`` handling), so the count never drops below one.
    """
    return max(1, model.kv_heads // tp)


def local_vocab(model: ModelSpec, tp: int) -> int:
    """Vocabulary rows on one tensor-parallel rank: ``ceil(V / tp)``.

    Megatron-LM pads the vocabulary to a multiple of ``128 * tp`` so it splits evenly; we only round up to
    a multiple of ``tp`` so that presets keep their published vocabulary (e.g. GPT-2's 50257).
    """
    return -(-model.vocab_size // tp)


def local_seq_length(model: ModelSpec, cp: int = 1) -> int:
    """Query tokens of one sequence on one context-parallel rank: ``s / cp`` (keys still span all ``s``)."""
    return model.seq_length // cp


def microbatch_tokens(model: ModelSpec, layout: Layout) -> int:
    """Tokens of one micro-batch on one rank of a replica: ``b * s / cp``."""
    return layout.micro_batch_size * local_seq_length(model, layout.cp)


def p2p_bytes(model: ModelSpec, layout: Layout) -> int:
    """Bytes of the activation (or its gradient) sent between pipeline stages per micro-batch.

    The boundary tensor is ``b * s * h`` elements in the working dtype; under sequence parallelism each
    tensor-parallel rank holds and sends only its ``s / tp`` slice (Korthikanti et al. 2022, section 4.2.3).
    """
    elements = microbatch_tokens(model, layout) * model.hidden_size
    if layout.sequence_parallel:
        elements //= layout.tp
    return elements * layout.param_bytes


def stage_layer_counts(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Transformer layers in each global stage (model chunk), uneven splits as the module docstring says."""
    return _stage_layer_counts(model.num_layers, layout.num_stages)


def _stage_layer_counts(num_layers: int, num_stages: int) -> tuple[int, ...]:
    if num_stages > num_layers:
        raise LayoutError(
            f"layout: pp * vpp = {num_stages} stages exceed the {num_layers} layers; every stage needs at "
            "least one layer, so lower pp or vpp"
        )
    per_stage = -(-num_layers // num_stages)
    counts = [per_stage] * num_stages
    order = [i // 2 if i % 2 == 0 else num_stages - 1 - i // 2 for i in range(num_stages)]
    for stage in order[: per_stage * num_stages - num_layers]:
        counts[stage] -= 1
    return tuple(counts)


def layers_per_stage(model: ModelSpec, layout: Layout) -> int:
    """Transformer layers in a middle pipeline stage: ``ceil(L / (pp * vpp))`` (exact when it divides)."""
    return max(stage_layer_counts(model, layout))


def stage_layers(model: ModelSpec, layout: Layout, stage: int) -> range:
    """Transformer layers of global stage ``stage`` as a half-open range."""
    stages = layout.num_stages
    if not isinstance(stage, int) or isinstance(stage, bool) or not 0 <= stage < stages:
        raise LayoutError(f"layout: stage = {stage!r} is outside 0..{stages - 1} (pp * vpp = {stages} stages)")
    counts = stage_layer_counts(model, layout)
    first = sum(counts[:stage])
    return range(first, first + counts[stage])


def stage_blocks(model: ModelSpec, layout: Layout, stage: int) -> range:
    """Sub-blocks of global pipeline stage ``stage`` (``0 .. pp*vpp - 1``) as a half-open range."""
    layers = stage_layers(model, layout, stage)
    start = 0 if stage == 0 else 1 + 2 * layers.start
    end = 2 * model.num_layers + 2 if stage == layout.num_stages - 1 else 1 + 2 * layers.stop
    return range(start, end)


def stage_of_block(model: ModelSpec, layout: Layout, block: int) -> int:
    """Global pipeline stage that holds a sub-block."""
    kind, layer = block_kind(model, block)
    if kind == "embed":
        return 0
    if kind == "head":
        return layout.num_stages - 1
    first = 0
    for stage, count in enumerate(stage_layer_counts(model, layout)):
        first += count
        if layer < first:
            return stage
    raise AssertionError("unreachable: layer index checked by block_kind")


def stages_of_rank(layout: Layout, pp_rank: int) -> list[int]:
    """Global stages (model chunks) placed on a pipeline rank, in chunk order."""
    if not isinstance(pp_rank, int) or not 0 <= pp_rank < layout.pp:
        raise LayoutError(f"layout: pipeline rank {pp_rank!r} is outside 0..{layout.pp - 1}")
    if layout.schedule in V_SCHEDULES:
        return [pp_rank, 2 * layout.pp - 1 - pp_rank]
    return [pp_rank + chunk * layout.pp for chunk in range(layout.vpp)]


def rank_of_stage(layout: Layout, stage: int) -> int:
    """Pipeline rank that runs a global stage (inverse of :func:`stages_of_rank`)."""
    if not 0 <= stage < layout.num_stages:
        raise LayoutError(f"layout: stage = {stage!r} is outside 0..{layout.num_stages - 1}")
    if layout.schedule in V_SCHEDULES and stage >= layout.pp:
        return 2 * layout.pp - 1 - stage
    return stage % layout.pp
