"""How fast compute runs while communication of the same rank is in flight (issue 12, overlap).

What a communication op takes from compute depends on what runs it (:func:`simgrid.costs.overlap_slowdown`):
an NCCL collective holds one SM per CTA, a Transformer Engine userbuffers collective its ``num_sm`` SMs, a point-to-point send/receive a few, a copy-engine transfer
(Transformer Engine's ring exchange) none, only HBM traffic; a host copy (``Transfer``) nothing. Compute runs
at the product of ``1 - s`` over what is in flight: once per collective (each is its own NCCL kernel on its own
communicator's stream, with its own CTAs), once for any number of sends and receives (a pipeline's
send/receive pairs are issued as one NCCL group, ``batch_isend_irecv``, and NCCL runs the operations of a
group call in a single kernel launch: NCCL user guide, "Aggregated Operations"), and once for any number of
copy-engine steps. The engines keep, per rank, one integer that counts the ops in flight by kind
(:meth:`OverlapModel.weight` added at start, subtracted at finish) and read the rate off that count, so the
rate depends only on which ops are in flight, never on the order simultaneous events are processed
(symmetric and full mode agree bit for bit).
"""

from __future__ import annotations

from typing import Any

from simgrid.ir import Collective, Recv, Send

_BITS = 20
_MASK = (1 << _BITS) - 1
COLLECTIVE_WEIGHT = 1
P2P_WEIGHT = 1 << _BITS
COPY_ENGINE_WEIGHT = 1 << (2 * _BITS)
USERBUFFERS_WEIGHT = 1 << (3 * _BITS)
"""Weights of one in-flight op of each kind in a rank's count: 2^20 ops of one kind never fly at once."""


def slowdowns(cost: Any) -> tuple[float, float, float, float]:
    """(collective, point-to-point, copy-engine, userbuffers) slowdowns of a cost model; a model that gives only
    ``comm_compute_slowdown`` (written before issue 12) applies it to all four."""
    collective = float(cost.comm_compute_slowdown)
    p2p = getattr(cost, "p2p_compute_slowdown", None)
    copy_engine = getattr(cost, "copy_engine_compute_slowdown", None)
    userbuffers = getattr(cost, "userbuffers_compute_slowdown", None)
    return (collective, collective if p2p is None else float(p2p),
            collective if copy_engine is None else float(copy_engine),
            collective if userbuffers is None else float(userbuffers))


class OverlapModel:
    """Compute rate for each mix of in-flight communication (memoised by the mix's count)."""

    __slots__ = ("active", "rates", "slowdowns")

    def __init__(self, cost: Any) -> None:
        self.slowdowns = slowdowns(cost)
        self.active = any(self.slowdowns)
        """Whether any communication slows compute (when not, the engines skip all re-timing)."""
        self.rates: dict[int, float] = {0: 1.0}
        """Count -> compute rate; the engines read it first and call :meth:`rate` on a miss."""

    @staticmethod
    def weight(op: Any) -> int:
        """What one in-flight ``op`` adds to its rank's count (0: a host copy, which slows nothing)."""
        t = type(op)
        if t is Collective:
            if op.kind == "ring_exchange":
                return COPY_ENGINE_WEIGHT
            return USERBUFFERS_WEIGHT if op.kernel == "userbuffers" else COLLECTIVE_WEIGHT
        if t is Send or t is Recv:
            return P2P_WEIGHT
        return 0

    def rate(self, count: int) -> float:
        """Compute rate while the ops counted by ``count`` are in flight: ``1 - s`` per collective (NCCL or
        userbuffers, each its own kernel), once for any sends/receives, once for any copy-engine steps (module
        docstring)."""
        rate = self.rates.get(count)
        if rate is None:
            s_coll, s_p2p, s_ce, s_ub = self.slowdowns
            rate = (1.0 - s_coll) ** (count & _MASK) * (1.0 - s_ub) ** ((count >> (3 * _BITS)) & _MASK)
            if (count >> _BITS) & _MASK:
                rate *= 1.0 - s_p2p
            if (count >> (2 * _BITS)) & _MASK:
                rate *= 1.0 - s_ce
            self.rates[count] = rate
        return rate
