"""Batching policies on hand-built queues: what each iteration holds, budgets, admission and preemption."""

from __future__ import annotations

from simgrid.serving import Request
from simgrid.serving.kv_cache import BlockPool
from simgrid.serving.policies import ReplicaQueue, SequenceState, form_static_batch, schedule_continuous


def _seq(i: int, prompt: int, output: int = 10) -> SequenceState:
    return SequenceState(request=Request(id=i, arrival_s=0.0, prompt_tokens=prompt, output_tokens=output),
                         target=prompt)


def _decoding(q: ReplicaQueue, i: int, cached: int) -> SequenceState:
    """A running sequence past its prefill holding the blocks of ``cached`` tokens."""
    seq = _seq(i, cached)
    seq.cached, seq.generated = cached, 1
    q.grow(seq, cached)
    q.running.append(seq)
    return seq


def _queue(blocks: int = 100, block_tokens: int = 16) -> ReplicaQueue:
    return ReplicaQueue(pool=BlockPool(blocks), block_tokens=block_tokens)


def _plan(works: list) -> list[tuple[int, int, bool]]:  # type: ignore[type-arg]
    return [(w.seq.request.id, w.new_tokens, w.samples) for w in works]


def test_prefill_first_pauses_decodes_while_a_prompt_can_start() -> None:
    """vLLM V0: a waiting prompt that fits gets a prefill-only iteration; the next one decodes everybody."""
    q = _queue()
    _decoding(q, 0, 40)
    q.waiting.append(_seq(1, 50))
    assert _plan(schedule_continuous(q, policy="prefill-first", max_batch=8, token_budget=4096)) == [(1, 50, True)]
    q.running[1].cached, q.running[1].generated = 50, 1
    assert _plan(schedule_continuous(q, policy="prefill-first", max_batch=8, token_budget=4096)) == [
        (0, 1, True), (1, 1, True)]


def test_mixed_runs_decodes_and_whole_prompts_together() -> None:
    """Orca: the decode of the running sequence and the new prompt share one iteration."""
    q = _queue()
    _decoding(q, 0, 40)
    q.waiting.append(_seq(1, 50))
    assert _plan(schedule_continuous(q, policy="mixed", max_batch=8, token_budget=4096)) == [(0, 1, True),
                                                                                              (1, 50, True)]


def test_chunked_fills_the_budget_after_the_decodes() -> None:
    """Sarathi-Serve: budget 10 with two decodes leaves an 8-token chunk; the prompt's next iteration goes on
    from there and only the chunk that completes the prompt samples a token."""
    q = _queue()
    _decoding(q, 0, 40)
    _decoding(q, 1, 40)
    q.waiting.append(_seq(2, 20))
    first = schedule_continuous(q, policy="chunked", max_batch=8, token_budget=10)
    assert _plan(first) == [(0, 1, True), (1, 1, True), (2, 8, False)]
    q.running[2].cached = 8
    for s in q.running[:2]:
        s.in_flight = True  # still in another pipeline stage: only the prompt continues
    assert _plan(schedule_continuous(q, policy="chunked", max_batch=8, token_budget=10)) == [(2, 10, False)]


def test_admission_respects_seats_budget_and_blocks_in_arrival_order() -> None:
    """max_batch caps running sequences; an unchunked prompt over the remaining budget waits (first come,
    first served: later prompts wait behind it); admission reserves the whole prompt's blocks."""
    q = _queue(blocks=10, block_tokens=16)
    for i, prompt in enumerate((48, 64, 16)):
        q.waiting.append(_seq(i, prompt))
    works = schedule_continuous(q, policy="prefill-first", max_batch=8, token_budget=100)
    assert _plan(works) == [(0, 48, True)]  # 48 + 64 > 100 and the 16-token prompt may not overtake
    assert q.pool.used == 3
    q2 = _queue(blocks=10)
    for i in range(3):
        q2.waiting.append(_seq(i, 16))
    assert len(schedule_continuous(q2, policy="prefill-first", max_batch=2, token_budget=100)) == 2


def test_out_of_blocks_preempts_the_latest_admitted() -> None:
    """Two decoding sequences each at a block boundary and one free block: the first decodes, the second has
    nothing left to take from and is preempted by recomputation: cache dropped, requeued at the head with its
    prompt plus its output so far to prefill."""
    q = _queue(blocks=3, block_tokens=16)
    a, b = _decoding(q, 0, 16), _decoding(q, 1, 16)
    b.generated = 4
    works = schedule_continuous(q, policy="prefill-first", max_batch=8, token_budget=100)
    assert _plan(works) == [(0, 1, True)]
    assert q.running == [a] and list(q.waiting) == [b]
    assert (b.blocks, b.cached, b.target, b.preemptions) == (0, 0, b.request.prompt_tokens + 4, 1)
    assert q.pool.used == 2


def test_static_batch_reserves_prompt_and_output() -> None:
    """Static batching reserves every request's whole sequence and stops at the first that does not fit."""
    q = _queue(blocks=5, block_tokens=16)
    for i in range(3):
        q.waiting.append(_seq(i, 20, output=12))  # 32 tokens = 2 blocks each
    batch = form_static_batch(q, max_batch=8)
    assert [s.request.id for s in batch] == [0, 1]
    assert q.pool.used == 4 and len(q.waiting) == 1


def test_decodes_count_against_a_chunked_budget() -> None:
    """With a 2-token budget only the first two of three running sequences decode in one iteration."""
    q = _queue()
    for i in range(3):
        _decoding(q, i, 20)
    assert _plan(schedule_continuous(q, policy="chunked", max_batch=8, token_budget=2)) == [(0, 1, True),
                                                                                              (1, 1, True)]


def test_work_shape_lists_each_prompt_chunk_for_the_attention_table() -> None:
    """An iteration of two decodes and an 8-token chunk after 8 cached prompt tokens: the shape is
    chunk_shape's sum, and its chunks name (8 new, 16 keys) only; decodes are one-token queries."""
    from simgrid.serving import chunk_shape, combine
    from simgrid.serving.policies import Work

    q = _queue()
    a, b = _decoding(q, 0, 40), _decoding(q, 1, 30)
    prompt = _seq(2, 20)
    prompt.cached = 8
    shape = q.work_shape([Work(a, 1, True), Work(b, 1, True), Work(prompt, 8, False)])
    expected = combine([chunk_shape(1, 40, sampled=True), chunk_shape(1, 30, sampled=True),
                        chunk_shape(8, 8, sampled=False)])
    assert shape == expected
    assert shape.chunks == ((8, 16),)
