"""``Layout.dropout`` (session 16): a run's own dropout setting overrides the model's usual recipe in the mask
bytes of the memory-bound kernels, the unfused core's attention dropout and the saved activations.

Expected values are written from the per-tensor accounting (Korthikanti et al. 2022 section 4.1: one 1-byte mask
per dropout element) and the kernels' byte counts, not read from the code under test."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.errors import LayoutError
from simgrid.layout.spec import Layout
from simgrid.model import block_cost, get_model, uses_dropout
from simgrid.model.kernels import block_kernels

GPT = get_model("gpt2-small")  # biases: the GPT recipe, dropout 0.1 by default
LLAMA = get_model("llama2-7b")
ATTN, MLP = 1, 2


def test_auto_follows_the_model_and_on_off_override_it() -> None:
    """``auto`` is the model's recipe (GPT yes, Llama no); ``on`` / ``off`` are the run's own setting."""
    assert uses_dropout(GPT) and uses_dropout(GPT, Layout()) and not uses_dropout(LLAMA, Layout())
    assert not uses_dropout(GPT, Layout(dropout="off"))
    assert uses_dropout(LLAMA, Layout(dropout="on"))


def test_off_removes_the_residual_masks_from_the_kernels_traffic() -> None:
    """The closing bias+dropout+residual add of each sub-block reads and writes one 1-byte mask element per residual
    element (forward and backward); with dropout off only that mask goes: s * h bytes per direction (mbs 1)."""
    s, h = GPT.seq_length, GPT.hidden_size
    for block in (ATTN, MLP):
        on = block_kernels(GPT, Layout(flash_attention=True), block)
        off = block_kernels(GPT, Layout(flash_attention=True, dropout="off"), block)
        assert on.fwd_hbm_bytes - off.fwd_hbm_bytes == s * h
        assert on.bwd_hbm_bytes - off.bwd_hbm_bytes == s * h
        assert on.residual_fwd_hbm_bytes - off.residual_fwd_hbm_bytes == s * h


def test_off_removes_the_unfused_cores_attention_dropout() -> None:
    """The unfused core's attention dropout reads the probabilities and writes its output and mask, a s^2 a
    (2 d + 1)-byte pass each way, and one launch each way; dropout off drops it."""
    s, a, d = GPT.seq_length, GPT.num_heads, 2
    on = block_kernels(GPT, Layout(), ATTN)
    off = block_kernels(GPT, Layout(dropout="off"), ATTN)
    drop = a * s * s * (2 * d + 1)
    assert on.core_fwd_hbm_bytes - off.core_fwd_hbm_bytes == drop
    assert on.bwd_hbm_bytes - off.bwd_hbm_bytes == drop + s * GPT.hidden_size  # and the residual mask
    assert (on.fwd_kernels - off.fwd_kernels, on.bwd_kernels - off.bwd_kernels) == (1, 1)


def test_off_frees_the_saved_masks_and_on_adds_them_to_llama() -> None:
    """Saved activations: the GPT attention sub-block without dropout keeps neither the residual mask (s h) nor the
    attention mask and dropout output (a s^2 (1 + d)); a Llama run with dropout on gains the residual masks (s h per
    sub-block) and, behind an unfused core, the attention mask and dropout output."""
    s, h, a, d = GPT.seq_length, GPT.hidden_size, GPT.num_heads, 2
    on = block_cost(GPT, Layout(), ATTN).activation_bytes
    off = block_cost(GPT, Layout(dropout="off"), ATTN).activation_bytes
    assert on - off == s * h + a * s * s * (1 + d)
    llama = dataclasses.replace(LLAMA, seq_length=512)
    ls, lh, la = llama.seq_length, llama.hidden_size, llama.num_heads
    plain = block_cost(llama, Layout(), ATTN).activation_bytes
    dropped = block_cost(llama, Layout(dropout="on"), ATTN).activation_bytes
    assert dropped - plain == ls * lh + la * ls * ls * (1 + d)
    assert block_cost(llama, Layout(dropout="on"), MLP).activation_bytes - block_cost(llama, Layout(), MLP).activation_bytes == ls * lh


def test_unknown_dropout_setting_is_one_line() -> None:
    with pytest.raises(LayoutError, match="dropout = 'maybe' is not one of auto, on, off"):
        Layout(dropout="maybe")  # type: ignore[arg-type]
