"""Runs of one session in worker processes at the same time, each started when a worker is free and the
memory plan has room for it.

`RunPool(concurrency, device, jobs)` starts its workers at once (their
imports overlap the parent's load of the weights). `run(context, ...)` sends
each the context (the pair's tensors by handle) and hands each job to
a free worker, first the first job in order whose planned bytes fit beside
those of the runs in flight (`Concurrency.room`); a job that fits nowhere
waits until runs end, and runs alone when none is left in flight (the
sequential plan has been checked already). It returns each run, its span
(start and end on this process's clock) and, on CUDA, the device's memory
use sampled while the workers ran.

The plan predicts each run's allocations; what a process holds beside them
(its allocator's cache, its context, cuBLAS's workspaces) is an estimate. A
run that runs out of device memory while others are in flight runs again,
alone: it goes first in line, waits until every run in flight has ended, and
nothing starts beside it. Runs do not read each other's results, so the run
is the one it would have been; the result lists it (`retried_alone`). A run
that runs out of memory alone fails as it would have in this process.

A run in a worker sees its own allocations only; the weights it maps are
added to its memory figures, so they compare with the plan and with a run in
one process. The first failure stops every worker and is raised here, as it
would have been raised by the same run in this process; a context a worker
cannot receive (a tokenizer or a part that does not pickle) raises
NotSendable, and the caller runs the session in this process instead.
"""

from __future__ import annotations

import pickle
import threading
import time
from multiprocessing.connection import wait

import torch

from parity.errors import OutOfDeviceMemory
from parity.harness import warm
from parity.harness.concurrency import Concurrency, Job
from parity.harness.run_context import NotSendable, RunContext
from parity.harness.workers import Worker

MEMORY_FIELDS = ("baseline_bytes", "peak_bytes", "peak_reserved_bytes", "reserved_bytes")


class RunPool:
    def __init__(self, concurrency: Concurrency, device: torch.device, jobs: list[Job]):
        self.concurrency, self.device, self.jobs = concurrency, torch.device(device), jobs
        self.workers = [Worker(i, warm.take()) for i in range(concurrency.jobs)] if concurrency.concurrent else []
        warm.release()      # workers started with the process that this session does not use

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        for worker in self.workers:
            worker.ask_to_stop()
        deadline = time.monotonic() + 2.0       # one wait for all: an idle worker exits at once, a busy one is killed
        for worker in self.workers:
            worker.stop(max(0.0, deadline - time.monotonic()))
        self.workers = []

    def run(self, context: RunContext, progress=None, on_run=None) -> dict:
        """{"runs": name -> ModeRun, "spans": name -> (start, end), "device": sampled memory or None,
        "planned_peak_bytes": the weights, the workers and the most planned bytes in flight at once}."""
        weights = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        sampler = DeviceSampler(self.device)     # before any worker maps the weights or makes its context
        try:
            for worker in self.workers:
                try:
                    worker.send_context(context)
                except (pickle.PicklingError, TypeError, AttributeError) as error:
                    raise NotSendable(f"the run context cannot be sent to a worker process "
                                      f"({type(error).__name__}: {error})") from None
            state = _Schedule(self.concurrency, self.jobs, scenario_requests=context.scenario.num_requests)
            while state.pending or state.running:
                state.dispatch(self.workers, progress)
                for conn in wait([w.conn for w in self.workers], timeout=1.0):
                    worker = next(w for w in self.workers if w.conn is conn)
                    state.receive(worker, progress, on_run, weights)
                state.check_alive(self.workers)
        except BaseException:
            self.close()
            raise
        finally:
            sampler.stop()
        c = self.concurrency
        planned = c.weights + c.jobs * c.overhead + state.peak_planned
        return {"runs": state.done, "spans": state.spans, "device": sampler.figures(weights),
                "planned_peak_bytes": planned, "retried_alone": state.retried}


class _Schedule:
    """Which job runs where, what is in flight, what came back."""

    def __init__(self, concurrency: Concurrency, jobs: list[Job], scenario_requests: int):
        self.concurrency, self.requests = concurrency, scenario_requests
        self.pending = list(jobs)
        self.running: dict[str, Job] = {}
        self.done: dict = {}
        self.spans: dict[str, tuple[float, float]] = {}
        self.started: dict[str, float] = {}
        self.peak_planned = 0
        self.retried: list[str] = []     # runs out of memory beside others, run again alone

    def dispatch(self, workers: list[Worker], progress) -> None:
        if not all(w.ready for w in workers):     # none starts before all can: a worker may yet refuse the context
            return
        for worker in workers:
            if worker.job is not None or not self.pending:
                continue
            job = self._next()
            if job is None:
                return
            self.pending.remove(job)
            self.running[job.name] = job
            self.peak_planned = max(self.peak_planned, sum(j.bytes for j in self.running.values()))
            worker.job = job.name
            if progress is not None:
                progress.start(job.name, self.requests)
            self.started[job.name] = time.perf_counter()
            worker.conn.send((job.name, job.mode, job.reference))

    def _next(self) -> Job | None:
        if any(name in self.retried for name in self.running):
            return None                                     # a run retried alone has the device to itself
        room = self.concurrency.room()
        held = sum(j.bytes for j in self.running.values())
        for job in self.pending:
            if job.name in self.retried:
                return None if self.running else job        # first in line, once nothing is in flight
            if room is None or held + job.bytes <= room or not self.running:
                return job
        return None

    def receive(self, worker: Worker, progress, on_run, weights: int) -> None:
        try:
            kind, name, value = worker.conn.recv()
        except (EOFError, OSError):
            raise RuntimeError(f"worker {worker.index} ended while running {worker.job or 'nothing'} "
                               f"(exit code {worker.process.exitcode})") from None
        if kind == "ready":
            worker.ready = True
        elif kind == "advance":
            if progress is not None:
                progress.advance(name, value)
        elif kind == "failed":
            if isinstance(value, OutOfDeviceMemory) and len(self.running) > 1 and name not in self.retried:
                self._again_alone(worker, name)
                return
            raise value
        elif kind == "unusable":
            raise NotSendable(value)
        else:
            self.spans[name] = (self.started[name], time.perf_counter())
            if value.memory is not None and weights:
                value.memory = {**value.memory, "shared_weights_bytes": weights,
                                **{k: value.memory[k] + weights for k in MEMORY_FIELDS if k in value.memory}}
            self.done[name] = value
            del self.running[name]
            worker.job = None
            if on_run is not None:
                on_run(value)

    def _again_alone(self, worker: Worker, name: str) -> None:
        """The run `name` ran out of device memory beside others: first in line again, to run alone."""
        self.pending.insert(0, self.running.pop(name))
        self.retried.append(name)
        worker.job = None

    def check_alive(self, workers: list[Worker]) -> None:
        for worker in workers:
            if not worker.process.is_alive() and not worker.conn.poll():
                raise RuntimeError(f"worker {worker.index} ended while running {worker.job or 'nothing'} "
                                   f"(exit code {worker.process.exitcode})")


class DeviceSampler:
    """The device's used memory (all processes: contexts, the weights, every worker's runs), sampled on CUDA."""

    def __init__(self, device: torch.device, every: float = 0.02):
        self.device, self.every = device, every
        self.before = self.peak = None
        self._stop = threading.Event()
        self._thread = None
        if device.type == "cuda":
            self.before = self.peak = self._used()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _used(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self._used())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def figures(self, weights: int) -> dict | None:
        """Used before the workers ran and at the peak; `peak_bytes`: the peak's rise plus the weights (the
        figure the concurrent plan predicts)."""
        if self.before is None:
            return None
        return {"used_before_bytes": self.before, "used_peak_bytes": self.peak,
                "peak_bytes": self.peak - self.before + weights}
