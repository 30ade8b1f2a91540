"""Where a search's layouts are evaluated: this process, a local process pool, or a Ray cluster.

Every backend evaluates a batch of :class:`~simgrid.sweep.evaluate.Task` values with a per-worker
:class:`~simgrid.sweep.evaluate.LayoutEvaluator` and returns the outcomes in task order; the search
decides batch by batch what to evaluate next, so all backends reach the same ranking.

* ``local``: worker processes started with ``spawn`` (the engine's state and a parent's threads, as in
  Jupyter, do not survive ``fork``), each loading the model and cluster once. If the workers die (a
  script without the ``if __name__ == "__main__":`` guard that spawn needs, or a worker killed for
  memory) the rest of the search runs in this process, with a message.
* ``ray``: one actor per worker CPU on a Ray cluster (``pip install 'llm-simgrid[cluster]'``); ``address``
  as :func:`ray.init` takes it (``"auto"`` joins the cluster this machine belongs to, ``"ray://host:10001"``
  a remote one, ``None`` starts a local Ray).
* ``serial`` (also ``local`` with one worker): this process.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import sys
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from simgrid.errors import SimgridError
from simgrid.gcpause import collector_paused
from simgrid.sweep.evaluate import LayoutEvaluator, Outcome, Task

BACKENDS: tuple[str, ...] = ("local", "ray")
"""Backend names ``simgrid sweep --backend`` accepts."""


class BackendError(SimgridError):
    """A backend cannot be used (unknown name, Ray missing or unreachable)."""


EvaluatorArgs = tuple[Any, ...]
"""``LayoutEvaluator``'s positional arguments and keyword dict: (model, cluster_ref, gpus, options, kwargs)."""


class SerialBackend:
    """Evaluates in this process."""

    def __init__(self, args: EvaluatorArgs) -> None:
        self.evaluator = _make_evaluator(args)
        self.workers = 1

    def evaluate(self, tasks: Sequence[Task]) -> list[Outcome]:
        with collector_paused():
            return [self.evaluator(task) for task in tasks]

    def close(self) -> None:
        pass


class ProcessBackend:
    """Evaluates in ``workers`` spawned processes (see the module docstring)."""

    def __init__(self, args: EvaluatorArgs, workers: int) -> None:
        self.args = args
        self.workers = workers
        self._fallback: SerialBackend | None = None
        context = multiprocessing.get_context("spawn")
        self._pool: cf.ProcessPoolExecutor | None = cf.ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_init_worker, initargs=(args,))
        # Start the workers now (the pool spawns on demand): they import and load the cluster while the
        # search computes its bounds.
        for _ in range(workers):
            self._pool.submit(_noop)

    def evaluate(self, tasks: Sequence[Task]) -> list[Outcome]:
        if self._pool is None:
            assert self._fallback is not None
            return self._fallback.evaluate(tasks)
        futures = [self._pool.submit(_evaluate_in_worker, task) for task in tasks]
        outcomes: list[Outcome | None] = []
        broken = False
        try:
            for future in futures:
                try:
                    outcomes.append(future.result())
                except BrokenProcessPool:
                    broken = True
                    outcomes.append(None)
                except Exception as exc:  # an unpicklable result fails its layout only
                    outcomes.append(Outcome("failed", detail=f"worker: {type(exc).__name__}: {exc}"))
        except BaseException:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            raise
        if broken:
            left = sum(o is None for o in outcomes)
            print(f"simgrid sweep: worker processes stopped ({left} layouts of this batch left); finishing the "
                  "search in this process. If this is a script, put the sweep under "
                  "`if __name__ == \"__main__\":`.", file=sys.stderr)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self._fallback = SerialBackend(self.args)
            redo = self._fallback.evaluate([t for t, o in zip(tasks, outcomes, strict=True) if o is None])
            it = iter(redo)
            outcomes = [o if o is not None else next(it) for o in outcomes]
        return [o for o in outcomes if o is not None]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayBackend:
    """Evaluates on Ray actors, one per worker (see the module docstring)."""

    def __init__(self, args: EvaluatorArgs, workers: int | None, address: str | None) -> None:
        ray = import_ray()
        self._ray = ray
        self._started = False
        check_reachable(address)
        if not ray.is_initialized():  # else use the Ray this process already joined
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         **({"num_cpus": workers} if address is None and workers else {}))
            except Exception as exc:  # ConnectionError, a timeout or Ray's own errors; one line for the user
                raise BackendError(
                    f"--address {address}: cannot reach a Ray cluster ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); start one with `ray start --head` "
                    "or give its address, e.g. ray://HOST:10001"
                ) from None
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, min(workers or cpus, cpus))
        actor = ray.remote(num_cpus=1)(_RayEvaluator)
        self._actors = [actor.remote(args) for _ in range(self.workers)]

    def evaluate(self, tasks: Sequence[Task]) -> list[Outcome]:
        ray = self._ray
        pending = {}
        for index, task in enumerate(tasks):
            ref = self._actors[index % len(self._actors)].run.remote(task)
            pending[ref] = index
        outcomes: list[Outcome | None] = [None] * len(tasks)
        for ref, index in pending.items():
            try:
                outcomes[index] = ray.get(ref)
            except Exception as exc:  # an actor lost or a result that failed to travel
                outcomes[index] = Outcome("failed", detail=f"ray worker: {type(exc).__name__}: {exc}")
        return [o for o in outcomes if o is not None]

    def close(self) -> None:
        for a in self._actors:
            self._ray.kill(a)
        self._actors = []
        if self._started:
            self._ray.shutdown()


class _RayEvaluator:
    """A Ray actor holding one evaluator."""

    def __init__(self, args: EvaluatorArgs) -> None:
        self.evaluator = _make_evaluator(args)

    def run(self, task: Task) -> Outcome:
        with collector_paused():
            return self.evaluator(task)


def make_backend(name: str, args: EvaluatorArgs, *, workers: int | None, address: str | None,
                 most: int | None = None) -> Any:
    """The backend called ``name`` (see :data:`BACKENDS`) with ``workers`` workers (default: every CPU),
    no more than ``most``."""
    if name not in BACKENDS:
        raise BackendError(f"--backend {name!r} is not one of {', '.join(BACKENDS)}")
    if name == "ray":
        return RayBackend(args, min(workers, most) if workers and most else workers, address)
    if address is not None:
        raise BackendError("--address is for --backend ray; the local backend runs on this machine")
    count = min(workers or os.cpu_count() or 1, most or 1 << 30)
    return SerialBackend(args) if count <= 1 else ProcessBackend(args, count)


ADDRESS_TIMEOUT_S = 5.0
"""Seconds to wait for a TCP connection to a Ray head before calling it unreachable (``ray.init`` itself
retries for minutes)."""


def check_reachable(address: str | None, timeout_s: float = ADDRESS_TIMEOUT_S) -> None:
    """Raise :class:`BackendError` unless ``HOST:PORT`` (or ``ray://HOST:PORT``) accepts a TCP connection;
    ``None`` and ``"auto"`` (a local start, or the cluster this machine belongs to) are not checked."""
    if address is None or address == "auto":
        return
    import socket

    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise BackendError(f"--address {address!r} is not HOST:PORT or ray://HOST:PORT (or auto)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise BackendError(
            f"--address {address}: cannot reach a Ray cluster ({exc.strerror or type(exc).__name__}); start one "
            "with `ray start --head` on the head node, or give its address"
        ) from None


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`BackendError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise BackendError("--backend ray needs Ray: pip install 'llm-simgrid[cluster]' (or pip install ray)") from None
    return ray


_WORKER: list[LayoutEvaluator] = []


def _make_evaluator(args: EvaluatorArgs) -> LayoutEvaluator:
    model, cluster_ref, gpus, options, kwargs = args
    return LayoutEvaluator(model, cluster_ref, gpus, options, **kwargs)


def _init_worker(args: EvaluatorArgs) -> None:
    import gc

    _WORKER[:] = [_make_evaluator(args)]
    # Everything loaded so far lives as long as the worker: keep the cyclic collector from rescanning it.
    gc.freeze()


def _noop() -> None:
    pass


def _evaluate_in_worker(task: Task) -> Outcome:
    with collector_paused():
        return _WORKER[0](task)
