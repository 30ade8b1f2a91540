"""Start one process per rank, set up torch.distributed and its process groups, collect results, never hang.

Two ways in: :func:`spawn_world` starts ``world_size`` local processes (``torch.multiprocessing``, start
method ``spawn``) and returns every rank's result to the parent; :func:`run_under_torchrun` runs the
current process as the rank that ``torchrun`` describes in ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
``MASTER_PORT``. Both call :func:`init_rank`, which initialises the backend (gloo on CPU; NCCL when CUDA
is available and asked for) with a bounded timeout and creates every process group of the program's
group table, in sorted-name order on every rank (``new_group`` is collective over the world).

Failure handling: each rank publishes the text of the op it is running in a shared buffer. A rank that
raises reports the op and the error; a rank that dies without reporting is found by its exit code; the
parent then terminates the others and raises :class:`ExecutionError` naming the rank and the op. An
overall deadline bounds the whole run. Each spawned rank also watches its parent (a thread polling the
parent pid every :data:`PARENT_POLL_S`): if the launching process is killed, the ranks print one line and
exit instead of living on as orphans. Under torchrun-style launches the rendezvous is bounded by
:data:`RENDEZVOUS_TIMEOUT_S`: a port already taken fails rank 0 at once, and the other ranks give up with
one line instead of waiting for a rank 0 that never comes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from simgrid.errors import SimgridError

OP_TEXT_BYTES = 240
"""Bytes of the shared buffer each rank writes its current op text into."""
PARENT_POLL_S = 0.5
"""How often a spawned rank checks that its launching process is still alive."""
PARENT_GONE_EXIT = 3
"""Exit status of a rank whose launching process died."""
RENDEZVOUS_TIMEOUT_S = 30.0
"""Longest wait for the torchrun-style rendezvous (rank 0's store at MASTER_ADDR:MASTER_PORT)."""


class ExecutionError(SimgridError):
    """A real run failed: a rank raised, died, timed out, or the launch could not start."""


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to start the ranks of one run."""

    world_size: int
    """Number of ranks (processes)."""
    backend: str = "gloo"
    """``gloo`` (CPU) or ``nccl`` (needs CUDA)."""
    master_addr: str = "127.0.0.1"
    """Rendezvous host."""
    master_port: int | None = None
    """Rendezvous port; None picks a free one (bind to port 0) per run."""
    comm_timeout_s: float = 30.0
    """Timeout of process-group initialisation and of every collective (gloo/NCCL ``timeout``)."""
    run_timeout_s: float = 120.0
    """Parent-side deadline for the whole run; stragglers are killed after it."""
    threads_per_rank: int | None = None
    """Intra-op threads per rank; None shares the machine's cores evenly (at least one)."""


@dataclass
class RankContext:
    """What a worker function gets: its rank, the world, the named process groups and the op reporter."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks."""
    groups: dict[str, Any] = field(default_factory=dict)
    """Group name -> torch process group (only groups this rank belongs to are usable)."""
    members: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Group name -> member global ranks."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Device tensors live on."""
    _op_buffer: Any = None

    def report_op(self, text: str) -> None:
        """Publish the op this rank is running, so a failure elsewhere can name it."""
        if self._op_buffer is None:
            return
        data = text.encode("utf-8", "replace")[: OP_TEXT_BYTES - 1]
        start = self.rank * OP_TEXT_BYTES
        self._op_buffer[start: start + len(data)] = data
        self._op_buffer[start + len(data)] = b"\0"


Worker = Callable[[RankContext, Any], Any]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`ExecutionError` if ``host:port`` cannot be bound (already in use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ExecutionError(
                f"MASTER_PORT {port} on {host} is not free ({exc.strerror}); pick another port or leave "
                "it unset so a free one is chosen"
            ) from None


def default_threads(world_size: int) -> int:
    """Intra-op threads per rank so that ranks do not oversubscribe the cores."""
    return max(1, (os.cpu_count() or 1) // world_size)


def init_rank(rank: int, world_size: int, groups: Mapping[str, Sequence[int]], *, backend: str,
              init_method: str | None, timeout_s: float, store: Any = None) -> RankContext:
    """Initialise torch.distributed for this rank and create every named group (same order on all ranks)."""
    if backend == "nccl" and not torch.cuda.is_available():
        raise ExecutionError("backend 'nccl' needs CUDA GPUs; none is available here: use --backend gloo")
    kwargs: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world_size,
                              "timeout": timedelta(seconds=timeout_s)}
    if store is not None:
        kwargs["store"] = store
    elif init_method is not None:
        kwargs["init_method"] = init_method
    dist.init_process_group(**kwargs)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    ctx = RankContext(rank=rank, world_size=world_size, device=device)
    for name in sorted(groups):
        members = tuple(int(r) for r in groups[name])
        ctx.members[name] = members
        if len(members) == world_size and members == tuple(range(world_size)):
            ctx.groups[name] = dist.group.WORLD
        else:
            group = dist.new_group(ranks=list(members), timeout=timedelta(seconds=timeout_s))
            if rank in members:
                ctx.groups[name] = group
    return ctx


def watch_parent(rank: int, parent_pid: int, interval_s: float = PARENT_POLL_S) -> threading.Thread:
    """Exit this rank (one line on stderr, status :data:`PARENT_GONE_EXIT`) once ``parent_pid`` is gone.

    A thread, not a signal handler: it runs while the main thread waits inside gloo (which releases the
    GIL), and ``os._exit`` ends the process even then. The parent's death is seen as a changed parent pid
    (the orphan is re-parented), so no signal from the dying parent is needed.
    """
    def watch() -> None:
        while True:
            time.sleep(interval_s)
            _exit_if_orphaned(rank, parent_pid)

    thread = threading.Thread(target=watch, name=f"rank{rank}-parent-watch", daemon=True)
    thread.start()
    return thread


def _exit_if_orphaned(rank: int, parent_pid: int) -> None:
    """Print the rank's one line and exit if its launcher is gone (it was re-parented)."""
    if os.getppid() != parent_pid:
        message = (f"simgrid-exec: error: rank {rank}: the launching process (pid {parent_pid}) died; "
                   "this rank stops\n")
        with contextlib.suppress(OSError):
            os.write(2, message.encode())
        os._exit(PARENT_GONE_EXIT)


def _child(rank: int, config: LaunchConfig, port: int, groups: Mapping[str, Sequence[int]], worker: Worker,
           payload: Any, results: Any, op_buffer: Any, parent_pid: int | None = None) -> None:
    if parent_pid is not None:
        watch_parent(rank, parent_pid)
    torch.set_num_threads(config.threads_per_rank or default_threads(config.world_size))
    ctx: RankContext | None = None
    try:
        ctx = init_rank(rank, config.world_size, groups, backend=config.backend,
                        init_method=f"tcp://{config.master_addr}:{port}", timeout_s=config.comm_timeout_s)
        ctx._op_buffer = op_buffer
        result = worker(ctx, payload)
        results.put(("ok", rank, result))
    except BaseException as exc:  # report everything, including KeyboardInterrupt, to the parent
        if parent_pid is not None:
            # A peer that saw the dead launcher first exits, and this rank's collective then fails: the
            # cause to report is the launcher, not the broken connection (and nobody reads the queue).
            _exit_if_orphaned(rank, parent_pid)
        text = _op_text(op_buffer, rank)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        results.put(("error", rank, text, detail, traceback.format_exc(limit=8)))
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _op_text(op_buffer: Any, rank: int) -> str:
    raw = bytes(op_buffer[rank * OP_TEXT_BYTES: (rank + 1) * OP_TEXT_BYTES])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or "<startup>"


def spawn_world(worker: Worker, payload: Any, config: LaunchConfig,
                groups: Mapping[str, Sequence[int]] | None = None) -> list[Any]:
    """Run ``worker(ctx, payload)`` on ``config.world_size`` local processes; return results by rank.

    ``worker`` must be a module-level function (it is pickled into spawned processes). Raises
    :class:`ExecutionError` naming the rank and op if any rank fails, dies or the deadline passes.
    """
    port = config.master_port
    if port is None:
        port = free_port(config.master_addr)
    else:
        check_port_free(config.master_addr, port)
    group_table = dict(groups or {"world": tuple(range(config.world_size))})
    mpctx = mp.get_context("spawn")
    results = mpctx.Queue()
    op_buffer = mpctx.Array("c", OP_TEXT_BYTES * config.world_size, lock=False)
    procs = [mpctx.Process(target=_child, args=(r, config, port, group_table, worker, payload, results, op_buffer,
                                                os.getpid()),
                           daemon=True, name=f"simgrid-exec-rank{r}") for r in range(config.world_size)]
    for p in procs:
        p.start()
    outcome: dict[int, Any] = {}
    failure: str | None = None
    deadline = time.monotonic() + config.run_timeout_s
    try:
        while len(outcome) < config.world_size and failure is None:
            try:
                message = results.get(timeout=0.2)
            except Exception:  # queue.Empty: check for dead ranks and the deadline
                failure = _dead_rank(procs, outcome, op_buffer) or _deadline(deadline, config, outcome, op_buffer)
                continue
            if message[0] == "ok":
                outcome[message[1]] = message[2]
            else:
                failure = _root_cause(message, results, procs, outcome, op_buffer)
    finally:
        _stop(procs, grace_s=0.5 if failure else 5.0)
    if failure is not None:
        raise ExecutionError(failure)
    return [outcome[r] for r in range(config.world_size)]


SECONDARY_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "Socket closed", "peer")
"""Error texts of a rank that only saw another rank go away: reported after the rank that caused it."""


def _root_cause(first: tuple[Any, ...], results: Any, procs: list[Any], outcome: dict[int, Any],
                op_buffer: Any) -> str:
    """Wait briefly for other failures and name the most likely root cause first."""
    errors = [first]
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        try:
            message = results.get(timeout=0.1)
        except Exception:
            continue
        if message[0] == "error":
            errors.append(message)
        else:
            outcome[message[1]] = message[2]
    dead = _dead_rank(procs, outcome, op_buffer, exclude={m[1] for m in errors})
    primary = [m for m in errors if not any(t in m[3] for t in SECONDARY_ERRORS)]
    secondary = [m for m in errors if m not in primary]
    parts = [dead] if dead else []
    parts += [f"rank {m[1]} failed at op '{m[2]}': {m[3]}" for m in primary + secondary]
    trace = (primary or errors)[0][4] if not dead else ""
    return "; then ".join(parts) + (f"\n{trace}" if trace else "")


def _dead_rank(procs: list[Any], outcome: dict[int, Any], op_buffer: Any,
               exclude: set[int] | None = None) -> str | None:
    for rank, p in enumerate(procs):
        if rank in outcome or (exclude and rank in exclude):
            continue
        if not p.is_alive() and p.exitcode not in (0, None):
            return (f"rank {rank} died (exit code {p.exitcode}) while running op "
                    f"'{_op_text(op_buffer, rank)}'")
    return None


def _deadline(deadline: float, config: LaunchConfig, outcome: dict[int, Any], op_buffer: Any) -> str | None:
    if time.monotonic() < deadline:
        return None
    late = [r for r in range(config.world_size) if r not in outcome]
    where = "; ".join(f"rank {r} at op '{_op_text(op_buffer, r)}'" for r in late)
    return f"run exceeded its {config.run_timeout_s:g} s deadline: {where}"


def _stop(procs: list[Any], grace_s: float) -> None:
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)


def run_under_torchrun(worker: Worker, payload: Any, groups: Mapping[str, Sequence[int]], *,
                       backend: str = "gloo", timeout_s: float = 60.0) -> Any:
    """Run this process as the rank torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR/PORT``).

    The rendezvous store is made here with at most :data:`RENDEZVOUS_TIMEOUT_S` (or ``timeout_s`` if less)
    to connect, so a taken port or a missing rank 0 is one line naming the rank and the cause, not a
    traceback on one rank and a silent wait on the others.
    """
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if not 0 <= rank < world:
        raise ExecutionError(f"RANK = {rank} must be in [0, WORLD_SIZE = {world})")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(default_threads(local))
    rendezvous_s = min(timeout_s, RENDEZVOUS_TIMEOUT_S)
    store = rendezvous_store(rank, world, rendezvous_s)
    try:
        with exit_after(rendezvous_s + 2.0 * world, f"rank {rank}: the other ranks did not join within "
                        f"{rendezvous_s:g} s of the rendezvous (one of them failed or was not started)"):
            ctx = init_rank(rank, world, groups, backend=backend, init_method=None, store=store,
                            timeout_s=timeout_s)
    except ExecutionError:
        raise
    except Exception as exc:  # a peer that vanished during start-up: name this rank and the cause
        raise ExecutionError(f"rank {rank}: joining the process group failed: {_first_line(exc)}") from None
    try:
        return worker(ctx, payload)
    finally:
        dist.destroy_process_group()


def rendezvous_store(rank: int, world: int, timeout_s: float) -> Any:
    """The TCPStore at ``MASTER_ADDR:MASTER_PORT``: hosted by rank 0 (unless torchrun's agent hosts it)."""
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT")
    if not 0 < port < 65536:
        raise ExecutionError(f"MASTER_PORT = {port} must be a port number 1-65535")
    hosted = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
    missing = (f"rank {rank}: no rendezvous at {addr}:{port} within {timeout_s:g} s: rank 0 did not start it (rank 0 "
               "failed, the port is held by another program, or MASTER_ADDR/MASTER_PORT differ between ranks)")
    try:
        # The store's own timeout does not cover a port held by another program (the client then waits for
        # a reply that never comes), hence the watchdog.
        with exit_after(timeout_s + 2.0, missing):
            return dist.TCPStore(addr, port, world, is_master=hosted, timeout=timedelta(seconds=timeout_s),
                                 wait_for_workers=False)
    except Exception as exc:  # DistNetworkError, DistStoreError, RuntimeError: all one line to the user
        if hosted:
            raise ExecutionError(
                f"rank 0: cannot host the rendezvous on {addr}:{port} ({_first_line(exc)}); the port is probably "
                "taken: start every rank with another MASTER_PORT"
            ) from None
        raise ExecutionError(missing) from None


@contextlib.contextmanager
def exit_after(seconds: float, message: str) -> Iterator[None]:
    """Run the block; if it is still running after ``seconds``, print ``message`` as one error line and exit
    the process with status 2 (for C++ calls that ignore their own timeouts and cannot be interrupted)."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            with contextlib.suppress(OSError):
                os.write(2, f"simgrid-exec: error: {message}\n".encode())
            os._exit(2)

    threading.Thread(target=watch, name="deadline", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _env_int(name: str) -> int:
    text = os.environ.get(name)
    try:
        return int(text or "")
    except ValueError:
        raise ExecutionError(f"not under torchrun: environment variable {name} = {text!r} is missing or not an "
                             "integer") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
