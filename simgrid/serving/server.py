"""The serving simulation (SimPy): a router, replicas, and pipeline stages that iterations flow through.

Each replica runs ``pp`` engines, vLLM's "virtual engines" for pipeline parallelism (vLLM 0.5+,
``LLMEngine``: one ``Scheduler`` per pipeline stage, each with ``1 / pp`` of the KV blocks, and a new
request goes to the scheduler with the fewest unfinished requests). An engine asks its policy for an
iteration, which then holds stage 0 for its time, crosses to stage 1, and so on, and the sampled tokens
return to stage 0. Stages are one-at-a-time resources, so up to ``pp`` iterations are in a replica's
pipeline at once, each on a different stage. With ``pp = 1`` there is one engine and one stage, and
iterations run back to back.

Requests are routed to a replica on arrival (:attr:`ServingConfig.router`). An idle engine sleeps until something
changes on its replica (an arrival or the end of an iteration). Ranks are placed replica by replica, stage
by stage, tensor-parallel rank fastest (a replica of up to a node's GPUs sits in one node).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from simgrid.hardware import Cluster
from simgrid.model.spec import ModelSpec
from simgrid.serving.iteration import BatchShape, IterationCostModel, IterationTime, chunk_shape, combine
from simgrid.serving.kv_cache import GIB, BlockPool, KVBudget, kv_budget
from simgrid.serving.policies import ReplicaQueue, SequenceState, Work, form_static_batch, schedule_continuous
from simgrid.serving.requests import Request, check_requests
from simgrid.serving.spec import ServingConfig, ServingError, ServingLayout
from simgrid.topology import Topology


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """What happened to one request."""

    id: int
    """Request index (arrival order)."""
    replica: int
    """Replica that served it."""
    arrival_s: float
    """Arrival time."""
    prompt_tokens: int
    """Prompt length."""
    output_tokens: int
    """Output length."""
    first_token_s: float
    """When its first output token was produced."""
    last_token_s: float
    """When its last output token was produced."""
    done_s: float
    """When its response returned."""
    preemptions: int
    """Times it lost its KV cache and was recomputed."""

    @property
    def ttft_s(self) -> float:
        """Time to first token."""
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; ``None`` for a one-token output."""
        if self.output_tokens < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float:
        """End-to-end latency: arrival to response."""
        return self.done_s - self.arrival_s


@dataclass(frozen=True, kw_only=True)
class IterationRecord:
    """One iteration of one replica."""

    replica: int
    """Replica index."""
    start_s: float
    """When it was scheduled."""
    end_s: float
    """When its tokens were back at the first stage."""
    tokens: int
    """New tokens it computed."""
    sequences: int
    """Sequences in it."""
    prefill_tokens: int
    """Of ``tokens``, prompt tokens (the rest are decode steps)."""


@dataclass(frozen=True, kw_only=True)
class ServingRun:
    """Raw output of one serving simulation."""

    records: tuple[RequestRecord, ...]
    """One per request, in id order."""
    iterations: tuple[IterationRecord, ...]
    """Every iteration, in start order."""
    kv_timeline: tuple[tuple[tuple[float, int], ...], ...]
    """Per replica: (time, KV blocks in use) at every change."""
    busy: tuple[tuple[tuple[tuple[float, float], ...], ...], ...]
    """Per replica and pipeline stage: (start, end) of every busy interval."""
    budget: KVBudget
    """KV capacity of one replica."""
    kv_blocks_per_replica: int
    """Blocks the replica's engines hold together (``pp`` engines of ``capacity // pp`` blocks)."""
    layout: ServingLayout
    """The deployment."""
    config: ServingConfig
    """The engine settings."""


class _Replica:
    def __init__(self, env: simpy.Environment, index: int, cost: IterationCostModel, budget: KVBudget,
                 config: ServingConfig) -> None:
        self.env, self.index, self.cost, self.config = env, index, cost, config
        pp = cost.layout.pp
        self.queues = [ReplicaQueue(pool=BlockPool(budget.capacity_blocks // pp), block_tokens=budget.block_tokens)
                       for _ in range(pp)]
        self.unfinished_by_engine = [0] * pp
        self.stages = [simpy.Resource(env, capacity=1) for _ in range(cost.layout.pp)]
        self.signal = env.event()
        self.kv: list[tuple[float, int]] = [(0.0, 0)]
        self.busy: list[list[tuple[float, float]]] = [[] for _ in self.stages]
        self.unfinished = 0

    def notify(self) -> None:
        """Wake the engines waiting for a change."""
        if not self.signal.triggered:
            self.signal.succeed()
        self.signal = self.env.event()

    def note_kv(self) -> None:
        used = sum(q.pool.used for q in self.queues)
        if self.kv[-1][1] != used:
            self.kv.append((self.env.now, used))


class ServingSimulation:
    """Build with the deployment and the workload, then :meth:`run`."""

    def __init__(self, model: ModelSpec, cluster: Cluster, layout: ServingLayout, config: ServingConfig,
                 requests: Sequence[Request]) -> None:
        if cluster.num_gpus < layout.world_size:
            raise ServingError(f"cluster {cluster.spec.name!r} has {cluster.num_gpus} GPUs but the layout "
                               f"{layout.label()} needs {layout.world_size}")
        check_requests(requests, max_context=model.seq_length)
        self.model, self.layout, self.config, self.requests = model, layout, config, list(requests)
        self.budget = kv_budget(model, layout, config, cluster.gpu, max_context=model.seq_length)
        self._check_fit()
        topology = Topology(cluster)
        self.costs = [IterationCostModel(model, layout, config, topology, replica=r) for r in range(layout.replicas)]
        self.token_budget = config.token_budget(model.seq_length)
        self.env = simpy.Environment()
        self.replicas = [_Replica(self.env, r, self.costs[r], self.budget, config) for r in range(layout.replicas)]
        self.done: list[tuple[SequenceState, int]] = []
        self.iterations: list[IterationRecord] = []

    def _check_fit(self) -> None:
        capacity = self.budget.capacity_blocks // self.layout.pp
        budget = self.config.token_budget(self.model.seq_length)
        unchunked = self.config.batching == "continuous" and self.config.policy != "chunked"
        for r in self.requests:
            need = self.budget.blocks_for(r.total_tokens)
            if need > capacity:
                per_gpu = max(s.kv_bytes_per_token for s in self.budget.stages) * r.total_tokens / GIB
                raise ServingError(
                    f"KV budget too small for one request: request {r.id} needs {r.total_tokens} tokens "
                    f"({per_gpu:.2f} GiB of KV cache per GPU) but an engine holds {capacity * self.budget.block_tokens}"
                    " tokens; raise tp, use --kv-dtype fp8, or raise the KV budget"
                )
            if unchunked and r.prompt_tokens > budget:
                raise ServingError(
                    f"request {r.id}: prompt of {r.prompt_tokens} tokens exceeds the token budget of {budget} per "
                    f"iteration; raise --max-batched-tokens or use --policy chunked"
                )

    # -- processes -------------------------------------------------------------------------------------
    def _route(self, request: Request) -> _Replica:
        if self.config.router == "round-robin":
            return self.replicas[request.id % len(self.replicas)]
        return min(self.replicas, key=lambda rep: (rep.unfinished, rep.index))

    def _arrivals(self) -> Generator[Any, Any, None]:
        for request in sorted(self.requests, key=lambda r: (r.arrival_s, r.id)):
            if request.arrival_s > self.env.now:
                yield self.env.timeout(request.arrival_s - self.env.now)
            rep = self._route(request)
            engine = min(range(len(rep.queues)), key=lambda e: (rep.unfinished_by_engine[e], e))
            rep.unfinished += 1
            rep.unfinished_by_engine[engine] += 1
            rep.queues[engine].waiting.append(SequenceState(request=request, target=request.prompt_tokens))
            rep.notify()

    def _iterate(self, rep: _Replica, shape: BatchShape, prefill_tokens: int, sequences: int
                 ) -> Generator[Any, Any, None]:
        """Run one iteration through the pipeline stages."""
        start = self.env.now
        time: IterationTime = rep.cost.time(shape)
        for p, stage in enumerate(rep.stages):
            with stage.request() as slot:
                yield slot
                began = self.env.now
                yield self.env.timeout(time.stage_s[p])
                rep.busy[p].append((began, self.env.now))
            if time.hop_s[p] > 0:
                yield self.env.timeout(time.hop_s[p])
        self.iterations.append(IterationRecord(replica=rep.index, start_s=start, end_s=self.env.now,
                                               tokens=shape.tokens, sequences=sequences,
                                               prefill_tokens=prefill_tokens))

    def _finish(self, rep: _Replica, engine: int, seq: SequenceState) -> None:
        seq.done_s = self.env.now
        rep.queues[engine].release(seq)
        rep.queues[engine].running.remove(seq)
        rep.unfinished -= 1
        rep.unfinished_by_engine[engine] -= 1
        self.done.append((seq, rep.index))

    def _continuous(self, rep: _Replica, engine: int) -> Generator[Any, Any, None]:
        cfg, queue = self.config, rep.queues[engine]
        while True:
            works: list[Work] = schedule_continuous(queue, policy=cfg.policy, max_batch=cfg.max_batch_size,
                                                    token_budget=self.token_budget)
            rep.note_kv()
            if not works:
                yield rep.signal
                continue
            for w in works:
                w.seq.in_flight = True
            prefill = sum(w.new_tokens for w in works if w.seq.prefilling)
            yield from self._iterate(rep, queue.work_shape(works), prefill, len(works))
            now = self.env.now
            for w in works:
                seq = w.seq
                seq.cached += w.new_tokens
                seq.in_flight = False
                if w.samples:
                    seq.generated += 1
                    seq.first_token_s = now if seq.first_token_s is None else seq.first_token_s
                    seq.last_token_s = now
                    if seq.finished:
                        self._finish(rep, engine, seq)
            rep.note_kv()
            rep.notify()

    def _static(self, rep: _Replica, engine: int) -> Generator[Any, Any, None]:
        while True:
            batch = form_static_batch(rep.queues[engine], max_batch=self.config.max_batch_size)
            rep.note_kv()
            if not batch:
                yield rep.signal
                continue
            for seq in batch:
                seq.in_flight = True
            shape = combine([chunk_shape(s.request.prompt_tokens, 0, sampled=True) for s in batch])
            yield from self._iterate(rep, shape, shape.tokens, len(batch))
            for seq in batch:
                seq.cached, seq.generated = seq.request.prompt_tokens, 1
                seq.first_token_s = seq.last_token_s = self.env.now
            while not all(s.finished for s in batch):
                # Every row decodes until the longest request ends (finished rows are computed as padding).
                shape = combine([chunk_shape(1, s.cached, sampled=True) for s in batch])
                yield from self._iterate(rep, shape, 0, len(batch))
                for seq in batch:
                    seq.cached += 1
                    if not seq.finished:
                        seq.generated += 1
                        seq.last_token_s = self.env.now
            for seq in batch:
                seq.in_flight = False
                self._finish(rep, engine, seq)
            rep.note_kv()
            rep.notify()

    def run(self) -> ServingRun:
        """Simulate until every request has its response."""
        self.env.process(self._arrivals())
        engine = self._static if self.config.batching == "static" else self._continuous
        for rep in self.replicas:
            for index in range(self.layout.pp):
                self.env.process(engine(rep, index))
        self.env.run()
        if len(self.done) != len(self.requests):  # pragma: no cover - a scheduler bug, not user input
            raise ServingError(f"serving simulation stalled with {len(self.requests) - len(self.done)} requests "
                               "unserved; please report this with the workload")
        records = sorted((RequestRecord(id=s.request.id, replica=r, arrival_s=s.request.arrival_s,
                                        prompt_tokens=s.request.prompt_tokens, output_tokens=s.request.output_tokens,
                                        first_token_s=float(s.first_token_s or 0.0),
                                        last_token_s=float(s.last_token_s or 0.0), done_s=float(s.done_s or 0.0),
                                        preemptions=s.preemptions) for s, r in self.done), key=lambda rec: rec.id)
        return ServingRun(
            records=tuple(records),
            iterations=tuple(sorted(self.iterations, key=lambda it: it.start_s)),
            kv_timeline=tuple(tuple(rep.kv) for rep in self.replicas),
            busy=tuple(tuple(tuple(stage) for stage in rep.busy) for rep in self.replicas),
            budget=self.budget, kv_blocks_per_replica=self.budget.capacity_blocks // self.layout.pp * self.layout.pp,
            layout=self.layout, config=self.config,
        )
