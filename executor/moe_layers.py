"""The MoE layer's MLP sub-block for real: softmax top-k router, routed experts spread over an expert-parallel
group, all-to-all dispatch and combine on its cuts, optional shared expert.

The block follows Megatron-Core's all-to-all token dispatcher (``MoEAlltoAllTokenDispatcher``) with MoE
parallel folding and expert tensor-parallel degree 1: each rank routes its own tokens (its sequence shard
under sequence parallelism) and holds ``E / ep`` whole experts. Segments and cuts:

* segment 0: norm, router, top-k, permute: the ``k`` copies of every token, ordered by expert (so by
  destination rank, then by that rank's local expert); the routing is kept in the run's ``scratch``;
* cut 0 (:data:`EP_DISPATCH`): the dispatch all-to-all forward, its gradient's all-to-all backward;
* segment 1: the received tokens grouped by local expert, each expert's MLP, back in received order;
* cut 1 (:data:`EP_COMBINE`): the combine all-to-all forward, its gradient's backward;
* segment 2: unpermute, each token's ``k`` expert outputs weighted by its router probabilities, plus the
  shared expert (scaled by its sigmoid gate), plus the residual.

Segment 2 recomputes the norm and the router logits from the block input instead of reading them from
segment 0: a segment reads only the block input and the leaf of the cut before it (the autograd cut at
every cut keeps each collective between compute ops), so the probabilities reach the weighted sum through
the block input. Both paths carry gradient, and their sum is the gradient of the unsplit layer.

Routing is deterministic: the experts are chosen on float64 logits (products of the fp32 values, so a rank
and the single-process reference, which multiply different numbers of rows at once, pick the same experts
unless two logits tie to ~1e-12), and the weights are the fp32 softmax probabilities of the chosen experts.
With one rank in the group (``ep = 1``, and the single-process reference) both cuts are the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from executor.block import BlockModule, SegmentInputs
from executor.tp import IDENTITY_CUT, CutComm, TPContext
from simgrid.errors import LayoutError
from simgrid.model.spec import ModelSpec

EP_DISPATCH = "ep_dispatch"
"""Pseudo-kind of the dispatch cut: an all-to-all of the permuted token copies (and of the gradients back)."""
EP_COMBINE = "ep_combine"
"""Pseudo-kind of the combine cut: an all-to-all of the expert outputs back to their tokens' ranks."""
EP_CUT_KINDS = (EP_DISPATCH, EP_COMBINE)

DISPATCH_CUT = CutComm(forward=EP_DISPATCH, backward=EP_DISPATCH)
COMBINE_CUT = CutComm(forward=EP_COMBINE, backward=EP_COMBINE)


@dataclass(frozen=True, kw_only=True)
class EPContext:
    """This rank's place in its expert-parallel group."""

    size: int = 1
    """Expert-parallel degree (``Layout.ep``)."""
    rank: int = 0
    """Index of this rank in its expert-parallel group: it holds experts ``rank * E/ep .. (rank+1) * E/ep - 1``."""

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise LayoutError(f"expert-parallel rank {self.rank} is outside 0..{self.size - 1}")


class MoeBlock(BlockModule):
    """Block ``2 + 2i`` of a MoE layer ``i``: router, the rank's experts, dispatch/combine cuts, shared expert."""

    def __init__(self, spec: ModelSpec, layer: int, weights: dict[str, torch.Tensor], tp: TPContext,
                 ep: EPContext | None = None) -> None:
        super().__init__(spec, 2 + 2 * layer, tp)
        moe = spec.moe
        if moe is None:
            raise LayoutError(f"model {spec.name!r} has no MoE layers")
        self.ep = ep or EPContext()
        if moe.num_experts % self.ep.size:
            raise LayoutError(f"expert-parallel size {self.ep.size} must divide the {moe.num_experts} experts")
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.local_count = moe.num_experts // self.ep.size
        self.first_expert = self.ep.rank * self.local_count
        self.normalize_top_k = moe.normalize_top_k
        prefix = f"L{layer}.moe"
        self._norm_params(prefix, weights)
        self._param("router_weight", f"{prefix}.router.weight", weights, None)
        #: Attribute names of the routed experts' parameters (synced over the expert data-parallel group).
        self.expert_attrs: set[str] = set()
        for e in range(self.first_expert, self.first_expert + self.local_count):
            before = set(self.full_names)
            self._mlp_params(f"expert{e}", f"{prefix}.experts.{e}", weights, split=False)
            self.expert_attrs |= set(self.full_names) - before
        self.shared = bool(moe.shared_expert_ffn_hidden_size)
        if self.shared:
            self._mlp_params("shared", f"{prefix}.shared", weights, split=True)
        self.shared_gate = moe.shared_expert_gate
        if self.shared_gate:
            self._param("shared_gate_weight", f"{prefix}.shared_gate.weight", weights, None)
        self.cuts = (DISPATCH_CUT, COMBINE_CUT) if self.ep.size > 1 else (IDENTITY_CUT, IDENTITY_CUT)

    # -- parameters ---------------------------------------------------------------------------------
    def _mlp_params(self, attr: str, prefix: str, weights: dict[str, torch.Tensor], *, split: bool) -> None:
        column, row = (0, 1) if split else (None, None)
        names = ("gate", "up") if self.spec.gated_mlp else ("fc1",)
        for name in names:
            self._param(f"{attr}_{name}_weight", f"{prefix}.{name}.weight", weights, column)
            if self.spec.bias:
                self._param(f"{attr}_{name}_bias", f"{prefix}.{name}.bias", weights, column)
        self._param(f"{attr}_fc2_weight", f"{prefix}.fc2.weight", weights, row)
        if self.spec.bias:
            self._param(f"{attr}_fc2_bias", f"{prefix}.fc2.bias", weights, None)

    def _mlp(self, attr: str, x: torch.Tensor) -> torch.Tensor:
        if self.spec.gated_mlp:
            inner = F.silu(self._linear(x, f"{attr}_gate")) * self._linear(x, f"{attr}_up")
        else:
            inner = F.gelu(self._linear(x, f"{attr}_fc1"))
        return self._linear(inner, f"{attr}_fc2")

    # -- routing ----------------------------------------------------------------------------------------
    def _tokens(self, run: SegmentInputs) -> torch.Tensor:
        """The normalised tokens of the run, ``[T, h]`` (T = the rank's tokens of the micro-batch)."""
        x = run.block_input
        return self._norm(x).reshape(-1, x.shape[-1])

    def _route(self, tokens: torch.Tensor) -> torch.Tensor:
        """The ``k`` chosen experts of each token, ``[T, k]``, from float64 logits (module docstring)."""
        with torch.no_grad():
            logits = tokens.detach().double() @ self.router_weight.detach().double().t()
            return logits.topk(self.top_k, dim=-1).indices

    def _weights(self, tokens: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """The router probabilities of the chosen experts, ``[T, k]`` (renormalised when the model does)."""
        probs = F.linear(tokens, self.router_weight).softmax(dim=-1).gather(1, chosen)
        return probs / probs.sum(dim=-1, keepdim=True) if self.normalize_top_k else probs

    # -- segments ---------------------------------------------------------------------------------------
    def segment(self, j: int, run: SegmentInputs) -> torch.Tensor:
        if j == 0:
            return self._dispatch(run)
        if j == 1:
            return self._experts(run)
        return self._combine(run)

    def _dispatch(self, run: SegmentInputs) -> torch.Tensor:
        tokens = self._tokens(run)
        chosen = self._route(tokens)
        expert_of_slot = chosen.reshape(-1)  # slot = token * k + choice
        order = torch.argsort(expert_of_slot, stable=True)  # by expert: by destination rank, then local expert
        counts = torch.bincount(expert_of_slot, minlength=self.num_experts)
        scratch = run.scratch
        scratch["chosen"], scratch["order"], scratch["counts"] = chosen, order, counts
        # With one rank in the group the tokens arrive as sent: the counts received are the counts sent.
        scratch["recv_counts"] = counts.view(1, -1)
        return tokens[order // self.top_k]

    def _experts(self, run: SegmentInputs) -> torch.Tensor:
        received = run.leaf(0)  # per source rank, per local expert, the tokens in order
        recv_counts = run.scratch["recv_counts"]  # [ep, local experts]
        labels = torch.arange(self.local_count).repeat(recv_counts.shape[0]).repeat_interleave(
            recv_counts.reshape(-1))
        by_expert = torch.argsort(labels, stable=True)
        grouped = received[by_expert]
        sizes = [int(n) for n in recv_counts.sum(dim=0)]
        outputs = [self._mlp(f"expert{self.first_expert + e}", rows) for e, rows in enumerate(grouped.split(sizes))]
        return torch.cat(outputs)[torch.argsort(by_expert)]  # back in received order for the combine

    def _combine(self, run: SegmentInputs) -> torch.Tensor:
        x = run.block_input
        tokens = self._tokens(run)
        chosen, order = run.scratch["chosen"], run.scratch["order"]
        returned = run.leaf(1)[torch.argsort(order)]  # expert output of each slot, in slot order
        weights = self._weights(tokens, chosen)
        mixed = (returned.view(-1, self.top_k, x.shape[-1]) * weights.unsqueeze(-1)).sum(dim=1)
        if self.shared:
            shared = self._mlp("shared", tokens)
            if self.shared_gate:
                shared = shared * torch.sigmoid(F.linear(tokens, self.shared_gate_weight))
            mixed = mixed + shared
        return x + mixed.view_as(x)
