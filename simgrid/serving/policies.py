"""Which sequences and how many of their tokens the next iteration of a replica runs.

Continuous (iteration-level) batching, Orca (Yu et al., OSDI 2022) and vLLM: the scheduler is asked again
before every iteration, so requests join as soon as there is room and leave as soon as they finish. Its
policy (:attr:`ServingConfig.policy`):

* ``prefill-first`` (vLLM V0's default scheduler, ``Scheduler._schedule_default``): if waiting prompts
  can be admitted, the iteration prefills them whole and running sequences do not decode; otherwise all
  running sequences decode one token. Good TTFT, but every admission stalls the decodes (TPOT spikes).
* ``mixed`` (Orca's selective batching): running sequences decode and new prompts are prefilled whole in
  the same iteration, within the token budget.
* ``chunked`` (Sarathi-Serve, Agrawal et al. OSDI 2024; vLLM ``--enable-chunked-prefill``): decode-first:
  every running sequence decodes, then unfinished prompts continue and new ones start in chunks that fill
  the rest of the token budget, so no iteration is much longer than the budget (stall-free).

Admission is first-come first-served, bounded by ``max_batch_size`` running sequences, the token budget
and free KV blocks: admission reserves the whole prompt's blocks, chunked or not (vLLM V0's
``BlockSpaceManager.allocate``), and a decoding sequence takes one block more whenever it crosses a block
boundary. When a decode finds no free block the
most recently admitted sequence is preempted by recomputation (vLLM's default ``PreemptionMode.RECOMPUTE``):
its blocks are freed and it returns to the head of the queue, to prefill its prompt and the tokens it had
generated again.

Static (request-level) batching, as FasterTransformer and TensorRT-LLM's ``gptSessionBenchmark`` run it:
a batch is formed from waiting requests (up to ``max_batch_size``, each reserving the KV blocks of its
whole prompt and output), prefilled in one iteration, and decoded until its longest request ends;
requests that end earlier keep their row (the kernels run on the whole batch) and return with the batch
(Orca, section 2.2). The server drives those iterations (:mod:`simgrid.serving.server`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from simgrid.serving.iteration import BatchShape
from simgrid.serving.kv_cache import BlockPool
from simgrid.serving.requests import Request


@dataclass(eq=False)
class SequenceState:
    """A request's progress on its replica."""

    request: Request
    """The request."""
    generated: int = 0
    """Output tokens produced so far."""
    cached: int = 0
    """Tokens whose K and V are in the cache."""
    target: int = 0
    """Tokens to prefill before the next token is sampled (prompt, plus generated ones after a preemption)."""
    blocks: int = 0
    """KV blocks held."""
    in_flight: bool = False
    """Part of an iteration that has not finished yet (pipeline parallelism keeps several in flight)."""
    first_token_s: float | None = None
    """When the first output token was produced."""
    last_token_s: float | None = None
    """When the latest output token was produced."""
    done_s: float | None = None
    """When the response returned (static batching: when the batch ended)."""
    preemptions: int = 0
    """Times the sequence lost its cache and was queued again."""

    @property
    def prefilling(self) -> bool:
        """Whether the next work of the sequence is prompt tokens rather than a decode step."""
        return self.cached < self.target

    @property
    def finished(self) -> bool:
        """Whether every output token has been produced."""
        return self.generated >= self.request.output_tokens


@dataclass(frozen=True)
class Work:
    """One sequence's part of an iteration."""

    seq: SequenceState
    """The sequence."""
    new_tokens: int
    """Tokens it feeds: a prompt chunk, or 1 to decode."""
    samples: bool
    """Whether a token is sampled for it at the end of the iteration."""


@dataclass
class ReplicaQueue:
    """Waiting and running sequences and the KV blocks of one replica."""

    pool: BlockPool
    """KV blocks."""
    block_tokens: int
    """Tokens per block."""
    waiting: deque[SequenceState] = field(default_factory=deque)
    """Arrived, not admitted (or preempted), first come first served."""
    running: list[SequenceState] = field(default_factory=list)
    """Admitted, holding KV blocks, in admission order."""

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        return -(-tokens // self.block_tokens)

    def grow(self, seq: SequenceState, tokens: int) -> bool:
        """Give ``seq`` the blocks to hold ``tokens`` tokens in total; False if the pool is short."""
        need = self.blocks_for(tokens) - seq.blocks
        if need <= 0:
            return True
        if need > self.pool.free:
            return False
        self.pool.take(need)
        seq.blocks += need
        return True

    def release(self, seq: SequenceState) -> None:
        """Free every block of ``seq``."""
        self.pool.give_back(seq.blocks)
        seq.blocks = 0

    def preempt(self, seq: SequenceState) -> None:
        """Recompute preemption: drop the cache, requeue at the head to prefill prompt and output so far."""
        self.release(seq)
        self.running.remove(seq)
        seq.cached, seq.target = 0, seq.request.prompt_tokens + seq.generated
        seq.preemptions += 1
        self.waiting.appendleft(seq)

    def work_shape(self, works: list[Work]) -> BatchShape:
        """The batch shape of an iteration (:func:`~simgrid.serving.iteration.chunk_shape` summed, inlined:
        this runs once per simulated iteration)."""
        tokens = pairs = context = sampled = 0
        chunks: list[tuple[int, int]] = []
        for w in works:
            q, k = w.new_tokens, w.seq.cached
            tokens += q
            pairs += q * k + q * (q + 1) // 2
            context += k + q
            sampled += w.samples
            if q > 1:
                chunks.append((q, k + q))
        return BatchShape(tokens=tokens, pairs=pairs, context_tokens=context, sampled=sampled, chunks=tuple(chunks))


def _decodes(q: ReplicaQueue, limit: int) -> list[Work]:
    """One decode step for each free running sequence past its prefill, preempting when blocks run out."""
    works: list[Work] = []
    chosen: set[int] = set()
    for seq in list(q.running):
        if len(works) >= limit:
            break
        if seq.in_flight or seq.prefilling or seq.blocks == 0:  # blocks == 0: preempted in this call
            continue
        while not q.grow(seq, seq.cached + 1):
            victims = [s for s in q.running if not s.in_flight and s is not seq and id(s) not in chosen]
            if not victims:
                break
            q.preempt(victims[-1])
        else:
            works.append(Work(seq, 1, True))
            chosen.add(id(seq))
            continue
        q.preempt(seq)  # no block anywhere: this sequence waits for others to finish
    return works


def _admit(q: ReplicaQueue, *, seats: int, budget: int, chunked: bool) -> list[Work]:
    """Start (or continue, when chunked) prefills first come first served within seats, budget and blocks."""
    works: list[Work] = []
    if chunked:
        for seq in q.running:
            if budget <= 0:
                return works
            if seq.in_flight or not seq.prefilling:
                continue
            chunk = min(seq.target - seq.cached, budget)
            works.append(Work(seq, chunk, seq.cached + chunk == seq.target))
            budget -= chunk
    while q.waiting and seats > 0 and budget > 0:
        seq = q.waiting[0]
        chunk = min(seq.target, budget) if chunked else seq.target
        # A prompt re-prefilled after a preemption may exceed the budget; it may still run alone.
        if (chunk > budget and works) or q.blocks_for(seq.target) > q.pool.free:
            break
        q.waiting.popleft()
        q.running.append(seq)
        q.grow(seq, seq.target)
        works.append(Work(seq, chunk, chunk == seq.target))
        seats -= 1
        budget -= chunk
    return works


def schedule_continuous(q: ReplicaQueue, *, policy: str, max_batch: int, token_budget: int) -> list[Work]:
    """The next iteration's work under a continuous-batching ``policy`` (module docstring); empty: nothing."""
    seats = max_batch - len(q.running)
    if policy == "prefill-first":
        prefills = _admit(q, seats=seats, budget=token_budget, chunked=False)
        return prefills if prefills else _decodes(q, max_batch)
    decodes = _decodes(q, min(max_batch, token_budget))  # decode tokens count against the budget too
    seats = max_batch - len(q.running)
    budget = token_budget - len(decodes)
    return decodes + _admit(q, seats=seats, budget=budget, chunked=policy == "chunked")


def form_static_batch(q: ReplicaQueue, *, max_batch: int) -> list[SequenceState]:
    """Waiting requests for one static batch, each reserving the blocks of its whole prompt and output."""
    batch: list[SequenceState] = []
    while q.waiting and len(batch) < max_batch:
        seq = q.waiting[0]
        if q.blocks_for(seq.request.total_tokens) > q.pool.free:
            break
        q.waiting.popleft()
        q.grow(seq, seq.request.total_tokens)
        q.running.append(seq)
        batch.append(seq)
    return batch
