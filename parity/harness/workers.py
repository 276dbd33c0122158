"""Worker processes that run modes at the same time, sharing one copy of the weights.

Each worker is a spawned process with its own engine per run (KV cache,
buffers, graphs and pools), its own CUDA context and stream, and the weights
of the parent, not a copy of them. It starts as soon as the pool does (its
imports overlap the parent's load) and receives the run context, the pair
included, over its pipe: torch's reductions send each CUDA tensor as a CUDA
IPC handle (the worker maps the parent's weights) and each CPU tensor through
shared memory (the parent's storage moves into it; its bytes do not change).

Not forked, on the CPU either: a child forked after the parent ran a
multi-threaded OpenMP region hangs in its first parallel op (measured here,
torch 2.13, libgomp), and one thread instead of the parent's would split
reductions differently, so a run would not compute the same bits.

A worker answers `ready`, then serves jobs one at a time: (name, mode,
reference) -> ("advance", name, n) while requests finish, then ("done", name,
ModeRun) or ("failed", name, error). The torch settings that decide which
kernels run and how they round (threads, TF32, reduced-precision reductions,
deterministic algorithms) are the parent's in every worker.
"""

from __future__ import annotations

import os
import io
import pickle
import signal
import traceback
import torch

from parity.harness.modes import run_mode, run_reference
from parity.harness.run_context import RunContext, apply_settings


class _TensorsAside(pickle.Pickler):
    """A pickler that sets every tensor and storage aside: whether the rest pickles, without copying weights
    (plain pickle would copy each CUDA tensor's bytes to the host: 16 GB at 8B, more than the host at 70B TP)."""

    def persistent_id(self, obj):
        return "tensor" if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)) else None


def sendable(*objects) -> str | None:
    """None when `objects` can go to a spawned worker; else why not (a class made at run time, a closure).
    Tensors go by torch's own reductions (CUDA IPC, shared memory), so only the rest is tried."""
    for obj in objects:
        try:
            _TensorsAside(io.BytesIO()).dump(obj)
        except Exception as error:  # noqa: BLE001 - any pickling failure means: keep the run in this process
            return f"{type(obj).__name__} cannot be sent to a worker process ({type(error).__name__}: {error})"
    return None


class Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, index: int, started=None):
        """`started`: (process, pipe) of a worker already spawned (`warm.py`); else one is spawned now."""
        self.index = index
        if started is not None:
            self.process, self.conn = started
        else:
            mp = torch.multiprocessing.get_context("spawn")
            self.conn, child = mp.Pipe()
            self.process = mp.Process(target=serve, args=(child,), name=f"parity-worker-{index}", daemon=True)
            self.process.start()
            child.close()
        self.job: str | None = None
        self.ready = False

    def send_context(self, context: RunContext) -> None:
        self.conn.send(context)

    def ask_to_stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass

    def stop(self, timeout: float) -> None:
        """Join the worker (asked to stop first); still alive after `timeout`, it is killed (busy in a run the
        session no longer wants, or tearing its interpreter down)."""
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def serve(conn) -> None:
    """A worker's life: the context, `ready`, then one job at a time until None or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the parent decides what an interrupt stops
    try:
        try:
            context = conn.recv()
        except (EOFError, OSError):
            raise
        except Exception as error:  # noqa: BLE001 - a context this process cannot rebuild: the parent runs it
            conn.send(("unusable", None, f"a worker could not receive the run context ({type(error).__name__}: "
                                         f"{error})"))
            return
        apply_settings(context.settings)
        if context.device.type == "cuda" and context.device.index is not None:   # plain "cuda": the default one
            torch.cuda.set_device(context.device)
        conn.send(("ready", None, os.getpid()))
        while True:
            job = conn.recv()
            if job is None:
                return
            conn.send(_run_job(conn, context, *job))
    except (EOFError, OSError):
        return


def _run_job(conn, context: RunContext, name: str, mode: str, reference: bool):
    def progress(step, done):
        if done:
            conn.send(("advance", name, len(done)))
    c = context
    try:
        if reference:
            run = run_reference(c.pair, c.scenario, mode, name, c.device, c.parts, progress=progress)
        else:
            run = run_mode(c.pair, c.scenario, mode, c.backend, c.device, c.parts, c.policy, progress=progress)
        return ("done", name, run)
    except BaseException as error:  # noqa: BLE001 - everything a run raises goes back to the parent
        try:
            pickle.dumps(error)
            return ("failed", name, error)
        except Exception:  # noqa: BLE001
            return ("failed", name, RuntimeError(f"the {name} run failed in a worker:\n{traceback.format_exc()}"))


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

