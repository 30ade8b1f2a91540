"""Layout construction rules and their error messages."""

from __future__ import annotations

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout, check_layout
from simgrid.model.spec import ModelSpec

GPT = ModelSpec(name="t", num_layers=8, hidden_size=64, num_heads=4, vocab_size=256, seq_length=32)


def test_defaults_pick_schedule_from_pipeline_degree() -> None:
    """pp = 1 defaults to no schedule, pp > 1 to 1F1B."""
    assert Layout().schedule == "none"
    assert Layout(pp=2).schedule == "1f1b"


def test_microbatch_count_is_global_batch_over_replicas() -> None:
    """m = gbs / (mbs * dp); world size is the product of degrees."""
    lay = Layout(dp=4, tp=2, pp=2, micro_batch_size=2, global_batch_size=64)
    assert lay.num_microbatches == 8
    assert lay.world_size == 16
    assert Layout(dp=3, micro_batch_size=2).gbs == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp": 0}, r"dp = 0 must be a positive integer"),
        ({"cp": 0}, r"cp = 0 must be a positive integer"),
        ({"tp": -2}, r"tp = -2 must be a positive integer"),
        ({"zero": 4}, r"zero = 4 must be a ZeRO stage"),
        ({"dp": 2, "micro_batch_size": 2, "global_batch_size": 6}, r"global_batch_size = 6 is not divisible"),
        ({"schedule": "1f1b"}, r"needs pipeline parallelism but pp = 1"),
        ({"pp": 2, "schedule": "none"}, r"pp = 2 needs a pipeline schedule"),
        ({"pp": 2, "schedule": "interleaved-1f1b", "global_batch_size": 4}, r"needs vpp >= 2"),
        (
            {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch_size": 5},
            r"m = 5 in max\(1, m // pp\) = 2 rounds of equal size \(pp = 2\).*use m = 4 or 6 \(m = global batch 5",
        ),
        ({"pp": 2, "vpp": 3, "schedule": "zbv", "global_batch_size": 4}, r"exactly 2 model chunks"),
        ({"pp": 2, "vpp": 2, "global_batch_size": 4}, r"vpp = 2 \(virtual stages\) only applies"),
        ({"sequence_parallel": True}, r"needs tp > 1"),
        ({"pp": 2, "zero": 2, "dp": 2, "global_batch_size": 4}, r"zero = 2 with pp = 2 is not supported"),
        ({"dp": 2, "zero": 1, "dp_mode": "parameter-server"}, r"parameter-server.*cannot"),
        ({"recompute": "some"}, r"recompute = 'some' is not one of none, selective, full"),
        ({"schedule": "pipedream"}, r"schedule = 'pipedream' is not one of"),
    ],
)
def test_bad_layouts_name_the_field_and_fix(kwargs: dict[str, object], message: str) -> None:
    """Each rule violation raises LayoutError naming the offending value."""
    with pytest.raises(LayoutError, match=message):
        Layout(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 3}, r"tp = 3 does not divide the 4 attention heads"),
        ({"pp": 4, "vpp": 3, "schedule": "interleaved-1f1b", "global_batch_size": 4}, r"= 12 stages exceed the 8"),
    ],
)
def test_model_dependent_rules(kwargs: dict[str, object], message: str) -> None:
    """check_layout rejects degrees the model's shape cannot be split by."""
    lay = Layout(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match=message):
        check_layout(GPT, lay)


def test_model_dependent_rules_accept_exact_splits() -> None:
    """pp * vpp = 8 stages of one layer each and tp = 4 over 4 heads are accepted."""
    check_layout(GPT, Layout(tp=4, pp=2, vpp=4, schedule="interleaved-1f1b", global_batch_size=2))


def test_round_trip_through_dict() -> None:
    """to_dict/from_dict reproduce the layout; unknown keys are rejected by name."""
    lay = Layout(dp=2, tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=8, zero=1)
    assert Layout.from_dict(lay.to_dict()) == lay
    with pytest.raises(LayoutError, match=r"unknown field\(s\) \['tpp'\]"):
        Layout.from_dict({"tpp": 2})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 1}, r"tp_comm_overlap .* needs tp > 1 with sequence parallelism \(tp = 1, sequence_parallel = False\)"),
        ({"tp": 2}, r"needs tp > 1 with sequence parallelism \(tp = 2, sequence_parallel = False\); set both"),
        ({"tp": 2, "sequence_parallel": True, "tp_comm_overlap": "yes"}, r"tp_comm_overlap = 'yes' must be true or false"),
    ],
)
def test_tp_comm_overlap_needs_tensor_and_sequence_parallelism(kwargs: dict[str, object], message: str) -> None:
    """Megatron-LM refuses --tp-comm-overlap without sequence parallelism; the layout says what to set."""
    with pytest.raises(LayoutError, match=message):
        Layout(**{"tp_comm_overlap": True, **kwargs})  # type: ignore[arg-type]


def test_tp_comm_overlap_is_off_by_default_and_round_trips() -> None:
    """Default off; a layout with it on survives to_dict / from the dict."""
    assert Layout().tp_comm_overlap is False
    lay = Layout(tp=2, sequence_parallel=True, tp_comm_overlap=True)
    assert Layout(**lay.to_dict()) == lay


def test_tp_async_grad_comm_defaults_off_round_trips_and_is_a_no_op_flag_at_tp_one() -> None:
    """Default off (today's synchronous lowering); on, it survives to_dict; tp = 1 accepts it (Megatron-LM
    turns it on only with a tensor-parallel group, so it is a no-op there)."""
    assert Layout().tp_async_grad_comm is False
    lay = Layout(tp=2, tp_async_grad_comm=True)
    assert Layout.from_dict(lay.to_dict()) == lay
    assert Layout(tp_async_grad_comm=True).tp == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_async_grad_comm": "yes"}, r"tp_async_grad_comm = 'yes' must be true or false"),
        ({"tp_async_grad_comm": True, "tp": 2, "sequence_parallel": True, "tp_comm_overlap": True},
         r"tp_async_grad_comm and tp_comm_overlap both overlap .*; turn one off"),
    ],
)
def test_tp_async_grad_comm_bad_values(kwargs: dict[str, object], message: str) -> None:
    """A non-bool, or together with Transformer Engine's overlap (which already hides these collectives)."""
    with pytest.raises(LayoutError, match=message):
        Layout(**kwargs)  # type: ignore[arg-type]


def test_selective_op_needs_fused_attention_and_sequence_parallel_with_tp() -> None:
    """Per-op checkpointing saves the fused kernel's outputs (needs flash_attention) and, with tp > 1, the
    sequence-parallel reduce-scatter outputs (needs sequence_parallel); MoE models are refused."""
    Layout(recompute="selective-op", flash_attention=True)
    Layout(recompute="selective-op", flash_attention=True, tp=2, sequence_parallel=True)
    with pytest.raises(LayoutError, match=r"selective-op.*turn flash_attention on"):
        Layout(recompute="selective-op")
    with pytest.raises(LayoutError, match=r"selective-op' with tp = 2.*turn sequence_parallel on"):
        Layout(recompute="selective-op", flash_attention=True, tp=2)
    from simgrid.model import get_model

    with pytest.raises(LayoutError, match="selective-op' is not modelled for MoE models"):
        check_layout(get_model("mixtral-8x7b"), Layout(recompute="selective-op", flash_attention=True))


def test_reduce_dtype_fp32_needs_fsdp2_under_zero3_only() -> None:
    """With zero 3 reduce_dtype is FSDP2's MixedPrecisionPolicy setting: 'fp32' with DeepSpeed ZeRO-3 is refused
    (the message names the fixes); with ZeRO 0-2 'fp32' is Megatron's fp32 main_grad and is accepted under any
    zero_impl; bad names are refused."""
    assert Layout().reduce_dtype == "param"
    Layout(dp=2, zero=3, zero_impl="fsdp2", reduce_dtype="fp32")
    for zero in (0, 1, 2):
        assert Layout(dp=2, zero=zero, reduce_dtype="fp32").reduce_dtype == "fp32"
    with pytest.raises(LayoutError, match=r"reduce_dtype 'fp32' with zero 3 is FSDP2's.*zero_impl = 'deepspeed'.*"
                                          r"zero 0-2"):
        Layout(dp=2, zero=3, reduce_dtype="fp32")
    with pytest.raises(LayoutError, match="reduce_dtype"):
        Layout(reduce_dtype="fp16")  # type: ignore[arg-type]


def test_optimizer_impl_defaults_to_fused_and_rejects_unknown_values() -> None:
    """Layout.optimizer_impl: fused by default, foreach accepted, anything else one line naming the choices."""
    assert Layout().optimizer_impl == "fused"
    assert Layout.from_dict(Layout(optimizer_impl="foreach").to_dict()).optimizer_impl == "foreach"
    with pytest.raises(LayoutError, match=r"^layout: optimizer_impl = 'apex' is not one of fused, foreach$"):
        Layout(optimizer_impl="apex")  # type: ignore[arg-type]


def test_tp_impl_defaults_to_megatron_and_refuses_bad_values() -> None:
    """tp_impl names whose tensor parallelism runs (megatron [s, b, h] or torchtitan's DTensor [b, s, h]): default
    megatron, dtensor survives to_dict, an unknown name and dtensor with Megatron's userbuffers overlap are refused."""
    assert Layout().tp_impl == "megatron"
    lay = Layout(tp=2, sequence_parallel=True, tp_impl="dtensor")
    assert Layout(**lay.to_dict()) == lay
    with pytest.raises(LayoutError, match="tp_impl = 'nemo' is not one of megatron, dtensor"):
        Layout(tp_impl="nemo")  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match=r"tp_comm_overlap is Megatron's.*tp_impl = 'dtensor'"):
        Layout(tp=2, sequence_parallel=True, tp_comm_overlap=True, tp_impl="dtensor")
    with pytest.raises(LayoutError, match=r"tp_async_grad_comm is Megatron's.*tp_impl = 'dtensor'"):
        Layout(tp=2, sequence_parallel=True, tp_async_grad_comm=True, tp_impl="dtensor")


def test_checkpoint_impl_defaults_to_reentrant_and_refuses_bad_values() -> None:
    """checkpoint_impl says how recompute 'full' checkpoints: reentrant (Megatron-LM) by default; the
    non-reentrant values survive to_dict; an unknown value, and non-reentrant with Megatron's own selective
    recompute or its userbuffers overlap, are one line naming the field."""
    assert Layout().checkpoint_impl == "reentrant"
    for impl in ("non-reentrant", "non-reentrant-modules"):
        lay = Layout(recompute="full", checkpoint_impl=impl)  # type: ignore[arg-type]
        assert Layout.from_dict(lay.to_dict()) == lay
    with pytest.raises(LayoutError, match=r"^layout: checkpoint_impl = 'sometimes' is not one of reentrant, "
                                          r"non-reentrant, non-reentrant-modules$"):
        Layout(checkpoint_impl="sometimes")  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match=r"^layout: checkpoint_impl = 'non-reentrant' is PyTorch's .* recompute "
                                          r"'selective' is Megatron-LM's, .*use checkpoint_impl 'reentrant'$"):
        Layout(recompute="selective", checkpoint_impl="non-reentrant")
    with pytest.raises(LayoutError, match=r"tp_comm_overlap is Megatron-LM's"):
        Layout(tp=2, sequence_parallel=True, tp_comm_overlap=True, checkpoint_impl="non-reentrant-modules")


@pytest.mark.parametrize("fields", [{"zero": 2}, {"zero": 3}, {"bucket_policy": "megatron"},
                                    {"pp": 2, "schedule": "zb-h1", "global_batch_size": 4}],
                         ids=["zero2", "zero3", "megatron-buckets", "zero-bubble"])
def test_zero_impl_apex_needs_zero1_ddp_buckets_and_megatron_schedules(fields: dict[str, object]) -> None:
    """zero_impl 'apex' (NeMo's DistributedFusedAdam) is ZeRO-1 with its own buckets under Megatron-Core's none /
    1f1b / interleaved-1f1b schedules: anything else is one line naming the fields and the fix."""
    assert Layout(dp=2, zero=1, zero_impl="apex").zero_impl == "apex"
    settings = {"dp": 2, "zero": 1, "zero_impl": "apex", **fields}
    with pytest.raises(LayoutError, match=r"zero_impl 'apex' is NeMo's apex DistributedFusedAdam.*use zero 1"):
        Layout(**settings)  # type: ignore[arg-type]
