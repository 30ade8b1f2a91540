"""Parameters, gradients and optimizer state of one rank under DP, parameter-server DP, ZeRO-1/2/3, offload.

Gradient life cycle in a step: backward accumulates into ``p.grad``; a synchronisation op (DP bucket
all-reduce, ZeRO reduce-scatter, parameter-server reduce, ZeRO-3 per-block reduce-scatter) *consumes* the
local gradients of its parameters (``p.grad`` is released) and adds the reduced result to an accumulator:
the full reduced gradient (DP, parameter server) or this rank's 1/dp shard (ZeRO). Consuming instead of
overwriting makes a sync per micro-batch (ZeRO-2) and a sync per step (DDP with gradient accumulation)
the same code.

Sharding (ZeRO-1/2): a bucket's parameters are flattened in bucket order and zero-padded to a multiple of
dp; rank ``i`` of the dp group owns elements ``[i*n/dp, (i+1)*n/dp)`` with its fp32 master slice and
optimizer moments (Rajbhandari et al., ZeRO, SC'20, section 5.1). ZeRO-3 shards every parameter on its
own (DeepSpeed partitions parameters individually), gathers a block's parameters before use and frees
them after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from executor.block import BlockModule, owned_parameters
from executor.comm import flatten, unflatten_into
from executor.optim import OptimizerConfig, optimizer_step


@dataclass
class BucketShard:
    """ZeRO-1/2 state of one gradient bucket on this rank."""

    names: list[str]
    """Full names of the bucket's parameters, in flattening order."""
    params: list[nn.Parameter]
    """The parameters (local tensor-parallel shards), in flattening order."""
    padded: int
    """Flattened length after padding to a multiple of dp."""
    start: int
    """First element of this rank's shard."""
    stop: int
    """One past the last element of this rank's shard."""
    master: torch.Tensor
    """fp32 values of this rank's shard (updated by OPT, gathered by the zero-param all-gather)."""
    grad: torch.Tensor
    """Reduced gradient accumulator of the shard."""
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    """Optimizer moments of the shard."""


@dataclass
class ParamShard:
    """ZeRO-3 state of one parameter on this rank."""

    name: str
    """Full name."""
    param: nn.Parameter
    """The module parameter (its data is empty while not gathered)."""
    shape: torch.Size
    """Full (tensor-parallel local) shape."""
    numel: int
    """Elements of the full parameter."""
    shard: torch.Tensor
    """This rank's padded 1/dp slice of the flattened parameter."""
    grad: torch.Tensor
    """Reduced gradient accumulator of the slice."""
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    """Optimizer moments of the slice."""


def block_parameters(modules: dict[int, BlockModule], blocks: list[int]) -> list[tuple[str, nn.Parameter]]:
    """Owned (full name, parameter) pairs of the given local blocks, without duplicates, in block order."""
    seen: set[int] = set()
    out: list[tuple[str, nn.Parameter]] = []
    for block in blocks:
        module = modules.get(block)
        if module is None:
            continue
        for name, p in owned_parameters(module):
            if id(p) not in seen:
                seen.add(id(p))
                out.append((name, p))
    return out


def is_expert_parameter(module: BlockModule, p: nn.Parameter) -> bool:
    """Whether ``p`` is one of a MoE block's routed-expert parameters (synced over the expert data-parallel
    group, in the ``ebucket`` buckets)."""
    attrs: set[str] = getattr(module, "expert_attrs", set())
    return any(getattr(module, attr) is p for attr in attrs)


def split_parameters(modules: dict[int, BlockModule], blocks: list[int], *, experts: bool
                     ) -> list[tuple[str, nn.Parameter]]:
    """Of :func:`block_parameters`, the routed experts' (``experts``) or every other one."""
    expert_ids = {id(p) for b in blocks if b in modules for _, p in owned_parameters(modules[b])
                  if is_expert_parameter(modules[b], p)}
    return [(n, p) for n, p in block_parameters(modules, blocks) if (id(p) in expert_ids) == experts]


def used_parameters(module: BlockModule) -> list[tuple[str, nn.Parameter]]:
    """Every parameter a block's compute reads, including a tied weight owned by another block."""
    out = owned_parameters(module)
    if getattr(module, "shared_weight", False):
        out.append(("embed.wte", module.head_weight))
    return out


class GradBook:
    """Reduced-gradient accumulators, ZeRO shards and optimizer states of this rank's parameters."""

    def __init__(self, modules: dict[int, BlockModule], *, dp_size: int, dp_index: int,
                 optimizer: OptimizerConfig, expert_dp_size: int = 1, expert_dp_index: int = 0) -> None:
        self.modules = modules
        self.dp_size = dp_size
        self.dp_index = dp_index
        #: The expert data-parallel group (MoE): routed-expert buckets are ZeRO-sharded over it.
        self.expert_dp_size = expert_dp_size
        self.expert_dp_index = expert_dp_index
        self.optimizer = optimizer
        self.reduced: dict[int, torch.Tensor] = {}
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.buckets: dict[tuple[int, int], BucketShard] = {}
        self.zero3: dict[int, ParamShard] = {}
        self.host_params: dict[int, torch.Tensor] = {}
        self.host_grads: dict[int, torch.Tensor] = {}

    # -- local gradients -------------------------------------------------------------------------
    @staticmethod
    def take_local(params: list[nn.Parameter]) -> torch.Tensor:
        """Flatten and release the local gradients of ``params`` (zeros where none accumulated)."""
        flat = flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        for p in params:
            p.grad = None
        return flat

    def add_reduced(self, params: list[nn.Parameter], flat: torch.Tensor) -> None:
        """Add a reduced flat gradient to the full accumulators of ``params``."""
        for p, g in zip(params, unflatten_into(flat, [p.shape for p in params]), strict=True):
            prev = self.reduced.get(id(p))
            self.reduced[id(p)] = g.clone() if prev is None else prev + g

    def full_grad(self, p: nn.Parameter) -> torch.Tensor:
        """The gradient the optimizer uses for an unsharded parameter: reduced if synchronised, else local."""
        found = self.reduced.get(id(p))
        if found is not None:
            return found
        return p.grad if p.grad is not None else torch.zeros_like(p)

    # -- ZeRO-1/2 ---------------------------------------------------------------------------------
    def bucket(self, key: tuple[int, int], named: list[tuple[str, nn.Parameter]]) -> BucketShard:
        """The (lazily created) shard state of bucket ``key = (stage, index)``; a routed-expert bucket has key
        ``(stage, -1 - index)`` and is sharded over the expert data-parallel group."""
        found = self.buckets.get(key)
        if found is None:
            params = [p for _, p in named]
            size, index = (self.expert_dp_size, self.expert_dp_index) if key[1] < 0 else (self.dp_size, self.dp_index)
            flat = flatten([p.detach() for p in params], pad_to=size)
            step = flat.numel() // size
            start, stop = index * step, (index + 1) * step
            found = BucketShard(names=[n for n, _ in named], params=params, padded=flat.numel(), start=start,
                                stop=stop, master=flat[start:stop].clone(), grad=flat.new_zeros(stop - start))
            self.buckets[key] = found
        return found

    @staticmethod
    def write_flat(params: list[nn.Parameter], flat: torch.Tensor) -> None:
        """Copy a flat parameter buffer (all-gathered or broadcast) into ``params``."""
        with torch.no_grad():
            for p, v in zip(params, unflatten_into(flat, [p.shape for p in params]), strict=True):
                p.copy_(v)

    def write_gathered(self, shard: BucketShard, full: torch.Tensor) -> None:
        """Copy an all-gathered flat bucket into its parameters."""
        self.write_flat(shard.params, full)

    # -- ZeRO-3 -----------------------------------------------------------------------------------
    def shard_zero3(self) -> None:
        """Partition every local parameter 1/dp and release the full copies (start of a ZeRO-3 run)."""
        for module in self.modules.values():
            for name, p in owned_parameters(module):
                if id(p) in self.zero3:
                    continue
                flat = flatten([p.detach()], pad_to=self.dp_size)
                step = flat.numel() // self.dp_size
                shard = flat[self.dp_index * step: (self.dp_index + 1) * step].clone()
                self.zero3[id(p)] = ParamShard(name=name, param=p, shape=p.shape, numel=p.numel(), shard=shard,
                                               grad=torch.zeros_like(shard))
                p.data = p.data.new_empty(0)  # on the parameter's device, so a later gather lands there

    def zero3_params(self, block: int) -> list[ParamShard]:
        """ZeRO-3 shards of every parameter block ``block`` reads (a tied head weight included)."""
        return [self.zero3[id(p)] for _, p in used_parameters(self.modules[block]) if id(p) in self.zero3]

    # -- optimizer --------------------------------------------------------------------------------
    def step_unsharded(self, blocks: list[int], step: int, *, host: bool = False,
                       skip: set[int] | None = None) -> None:
        """Adam/SGD on full parameters owned by ``blocks`` (DP, parameter-server root, offload on host), but
        not those whose ids are in ``skip`` (updated by their ZeRO bucket shard)."""
        for _, p in block_parameters(self.modules, blocks):
            if skip is not None and id(p) in skip:
                continue
            state = self.states.setdefault(id(p), {})
            if host:
                optimizer_step(self.host_params[id(p)], self.host_grads[id(p)], state, self.optimizer, step)
            else:
                optimizer_step(p.data, self.full_grad(p), state, self.optimizer, step)

    def step_buckets(self, keys: list[tuple[int, int]], step: int) -> None:
        """ZeRO-1/2: update this rank's master slice of each bucket."""
        for key in keys:
            shard = self.buckets[key]
            optimizer_step(shard.master, shard.grad, shard.state, self.optimizer, step)

    def step_zero3(self, blocks: list[int], step: int) -> None:
        """ZeRO-3: update this rank's slice of every parameter owned by ``blocks``."""
        for _, p in block_parameters(self.modules, blocks):
            shard = self.zero3[id(p)]
            optimizer_step(shard.shard, shard.grad, shard.state, self.optimizer, step)

    def end_step(self) -> None:
        """Clear every gradient and accumulator for the next step."""
        self.reduced.clear()
        self.host_grads.clear()
        for module in self.modules.values():
            for p in module.parameters():
                p.grad = None
        for shard in self.buckets.values():
            shard.grad.zero_()
        for pshard in self.zero3.values():
            pshard.grad.zero_()
