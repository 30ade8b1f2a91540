"""Context parallelism (Llama 3 all-gather CP) in the executor: token chunks, and CP ranks emulated in one
process (K/V all-gather and dK/dV reduce-scatter performed by hand) reproducing the full-sequence model."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import executor.cp as cp_module  # noqa: E402
from executor.blockrun import BlockRun  # noqa: E402
from executor.cp import CP_KV, CPContext, causal_allowed, chunk_positions, gathered_positions  # noqa: E402
from executor.model import BlockModule, build_blocks, init_weights, owned_parameters  # noqa: E402
from executor.reference import run_forward_backward  # noqa: E402
from executor.tp import TPContext  # noqa: E402
from simgrid.errors import LayoutError  # noqa: E402
from simgrid.model.spec import ModelSpec  # noqa: E402

GPT = ModelSpec(name="t-gpt", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64, seq_length=16)
LLAMA = ModelSpec(name="t-llama", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                  ffn_hidden_size=48, gated_mlp=True, vocab_size=64, seq_length=16, tied_embeddings=False,
                  norm="rmsnorm", position="rope", bias=False)


def test_rank_holds_chunk_i_and_its_mirror_of_two_cp_chunks() -> None:
    """seq 16, cp 2: four chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (Llama 3, 3.3.2)."""
    assert chunk_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert gathered_positions(16, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    # Every rank's causal work (keys visible to its queries) is the same: 2 cp chunks balance.
    work = [int(causal_allowed(chunk_positions(16, 4, r), 16).sum()) for r in range(4)]
    assert work == [work[0]] * 4


def test_context_errors_name_the_values() -> None:
    """A rank outside the group, or a sequence 2 * cp does not divide, is refused with a message."""
    with pytest.raises(LayoutError, match=r"context-parallel rank 2 is outside 0\.\.1"):
        CPContext(size=2, rank=2)
    with pytest.raises(LayoutError, match="cp = 3 splits a sequence into 6 chunks, which must divide seq_length 16"):
        chunk_positions(16, 3, 0)


class _Exchange:
    """In-process stand-in for the CP group: collectives are issued by every rank, then completed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.gathers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.reduces: list[torch.Tensor] = []

    def all_gather_dim0(self, shard: torch.Tensor, group: Any, size: int) -> tuple[torch.Tensor, None]:
        out = torch.empty((shard.shape[0] * size, *shard.shape[1:]))
        self.gathers.append((shard.clone(), out))
        return out, None

    def reduce_scatter_dim0(self, full: torch.Tensor, group: Any, size: int, index: int, backend: str
                            ) -> tuple[Any, None, str]:
        self.reduces.append(full.clone())
        step = full.shape[0] // size
        return (lambda: torch.stack(self.reduces).sum(0)[index * step: (index + 1) * step]), None, ""

    def complete(self) -> None:
        if self.gathers:
            full = torch.cat([shard for shard, _ in self.gathers])
            for _, out in self.gathers:
                out.copy_(full)
        self.gathers = []


def _cp_training_step(spec: ModelSpec, cp: int, tokens: torch.Tensor, targets: torch.Tensor, *,
                      flash: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[float, dict[str, torch.Tensor]]:
    """Forward and backward of ``cp`` ranks in lock step; returns (mean of rank losses, summed gradients)."""
    exchange = _Exchange(cp)
    monkeypatch.setattr(cp_module, "all_gather_dim0", exchange.all_gather_dim0)
    monkeypatch.setattr(cp_module, "reduce_scatter_dim0", exchange.reduce_scatter_dim0)
    weights = init_weights(spec, 0)
    blocks = list(range(2 * spec.num_layers + 2))
    contexts = [CPContext(size=cp, rank=r) for r in range(cp)]
    ranks = [build_blocks(spec, blocks, weights, TPContext(), flash_attention=flash, cp=c) for c in contexts]
    mine = [c.positions(spec.seq_length) for c in contexts]
    inputs: list[torch.Tensor] = [tokens[p] for p in mine]
    all_runs: list[list[BlockRun]] = []
    for b in blocks:
        runs = [BlockRun(ranks[r][b], 0, inputs[r], targets[mine[r]] if b == blocks[-1] else None)
                for r in range(cp)]
        _lock_step(runs, contexts, exchange, forward=True)
        inputs = [run.output for run in runs]
        all_runs.append(runs)
    losses = [float(run.output.detach()) for run in all_runs[-1]]
    grads = [torch.tensor(1.0 / cp)] * cp  # each rank's loss is the mean over its tokens: average over cp
    for runs in reversed(all_runs):
        for run, grad in zip(runs, grads, strict=True):
            run.set_output_grad(grad)
        _lock_step(runs, contexts, exchange, forward=False)
        grads = [run.input_grad for run in runs]  # type: ignore[misc]
    summed: dict[str, torch.Tensor] = {}
    for modules in ranks:  # the data-parallel (dp * cp) gradient sum
        for module in modules.values():
            for name, p in owned_parameters(module):
                summed[name] = summed.get(name, 0) + p.grad  # type: ignore[operator]
    return sum(losses) / cp, summed


def _lock_step(runs: list[BlockRun], contexts: list[CPContext], exchange: _Exchange, *, forward: bool) -> None:
    while True:
        cuts = [run.forward() if forward else run.backward("B") for run in runs]
        if cuts[0] is None:
            assert all(c is None for c in cuts)
            return
        cut = cuts[0]
        module: BlockModule = runs[0].module
        kind = module.cuts[cut].forward if forward else module.cuts[cut].backward
        assert kind == CP_KV
        if forward:
            issued = [cp_module.start_kv_gather(run.forward_comm_input(cut), module.q_width, c, None)[1]
                      for run, c in zip(runs, contexts, strict=True)]
            exchange.complete()
            for run, leaf in zip(runs, issued, strict=True):
                run.set_forward_comm_result(cut, leaf())
        else:
            exchange.reduces = []
            started = [cp_module.start_kv_grad_scatter(run.backward_comm_input(cut), run.outputs[cut].shape,
                                                       module.q_width, c, None, c.rank, "gloo")[1]
                       for run, c in zip(runs, contexts, strict=True)]
            for run, grad in zip(runs, started, strict=True):
                run.set_backward_comm_result(cut, grad())


@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt-learned-positions", "llama-rope-gqa"])
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("flash", [False, True], ids=["scores", "sdpa"])
def test_cp_ranks_reproduce_full_sequence_loss_and_gradients(spec: ModelSpec, cp: int, flash: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """cp ranks, each holding two chunks and exchanging K/V by the cut's real gather/scatter code, give the
    single-sequence loss (mean over ranks) and, summed over ranks, every parameter's gradient."""
    gen = torch.Generator().manual_seed(3)
    seqs = torch.randint(0, spec.vocab_size, (2, spec.seq_length + 1), generator=gen)
    tokens, targets = seqs[:, :-1].t().contiguous(), seqs[:, 1:].t().contiguous()
    modules = build_blocks(spec, list(range(2 * spec.num_layers + 2)), init_weights(spec, 0), TPContext(),
                           flash_attention=flash)
    ref_loss = run_forward_backward(modules, tokens, targets, 1.0)
    loss, grads = _cp_training_step(spec, cp, tokens, targets, flash=flash, monkeypatch=monkeypatch)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for module in modules.values():
        for name, p in owned_parameters(module):
            assert p.grad is not None
            err = float((grads[name] - p.grad).norm() / max(float(p.grad.norm()), 1e-12))
            assert err <= 1e-5 or float(p.grad.norm()) < 1e-6, f"{name}: relative error {err:.1e}"
