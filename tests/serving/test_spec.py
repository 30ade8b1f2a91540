"""Serving layout and engine settings: vLLM's defaults, derived sizes and refusals of bad values."""

from __future__ import annotations

import pytest

from simgrid.serving import ServingConfig, ServingError, ServingLayout
from simgrid.serving.spec import model_layout


def test_layout_sizes_and_label() -> None:
    """A layout of tp 4, pp 2, 3 replicas uses 8 GPUs per replica and 24 in all."""
    lay = ServingLayout(tp=4, pp=2, replicas=3)
    assert (lay.gpus_per_replica, lay.world_size, lay.label()) == (8, 24, "tp4 pp2 x3")


def test_defaults_follow_vllm_engine_args() -> None:
    """max_num_seqs 256, block_size 16, gpu_memory_utilization 0.9 (vLLM EngineArgs)."""
    cfg = ServingConfig()
    assert (cfg.max_batch_size, cfg.block_tokens, cfg.memory_utilization) == (256, 16, 0.9)
    assert (cfg.batching, cfg.policy) == ("continuous", "prefill-first")


def test_token_budget_follows_vllm_scheduler_config() -> None:
    """Unchunked: max(context, 2048); chunked: 2048; an explicit budget wins; static uses the unchunked rule."""
    assert ServingConfig().token_budget(4096) == 4096
    assert ServingConfig().token_budget(1024) == 2048
    assert ServingConfig(policy="chunked").token_budget(8192) == 2048
    assert ServingConfig(policy="chunked", max_batched_tokens=512).token_budget(8192) == 512
    assert ServingConfig(batching="static", policy="chunked").token_budget(8192) == 8192


def test_dtype_bytes() -> None:
    """KV follows the activations (bf16: 2 bytes) unless fp8; fp8 weights keep 16-bit activations."""
    assert ServingConfig().kv_bytes == 2
    assert ServingConfig(kv_dtype="fp8").kv_bytes == 1
    assert ServingConfig(dtype="fp32").kv_bytes == 4
    fp8 = ServingConfig(dtype="fp8")
    assert (fp8.weight_bytes, fp8.activation_dtype, fp8.kv_bytes) == (1, "bf16", 2)


def test_model_layout_is_a_fused_attention_replica() -> None:
    """The replica's Layout for the model costs: same tp/pp, flash attention, 16-bit (or fp32) activations,
    and no dropout (inference draws no mask, whatever the model's training recipe)."""
    lay = model_layout(ServingLayout(tp=2, pp=2, replicas=5), ServingConfig())
    assert (lay.tp, lay.pp, lay.dp, lay.flash_attention, lay.param_bytes) == (2, 2, 1, True, 2)
    assert lay.dropout == "off"
    assert model_layout(ServingLayout(), ServingConfig(dtype="fp32")).param_bytes == 4


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"memory_utilization": 1.5}, r"memory_utilization = 1\.5 must be in \(0, 1\]"),
    ({"policy": "fastest"}, "policy = 'fastest' is not one of prefill-first, mixed, chunked"),
    ({"max_batch_size": 0}, "max_batch_size = 0 must be a positive integer"),
    ({"kv_budget_GiB": -1.0}, r"kv_budget_GiB = -1\.0 must be > 0"),
    ({"kv_dtype": "int4"}, "kv_dtype = 'int4' is not one of"),
])
def test_bad_config_is_refused_with_the_field(kwargs: dict[str, object], message: str) -> None:
    """Each bad setting raises a ServingError naming the field and its value."""
    with pytest.raises(ServingError, match=message):
        ServingConfig(**kwargs)  # type: ignore[arg-type]


def test_bad_layout_is_refused() -> None:
    """Degrees must be positive integers."""
    with pytest.raises(ServingError, match="replicas = 0 must be a positive integer"):
        ServingLayout(replicas=0)
