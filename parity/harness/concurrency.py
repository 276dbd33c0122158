"""How many runs of a session go at once: the memory plan, the request's --jobs and the device decide.

The runs of a session (eager, each graph mode, each padded reference) do not
read each other's results, so they may run at the same time in worker
processes that share the one copy of the weights (`workers.py`). Each run in
flight holds what the plan gives its mode beyond the weights (KV cache,
buffers, graph pools, activations, capture copy, slack; a padded reference
holds eager's run and its padding probe's copies), and each worker process its own context
(`WORKER_OVERHEAD`). The width is the most workers such that the weights, their
contexts and the smallest runs that many at once fit the plan's budget; below
two, the session runs sequentially, in this process, and says why. Which runs
then share the device is decided run by run as they start (`concurrent.py`).

Defaults: concurrent on CUDA for a pair of at least `AUTO_MIN_WEIGHTS` (as
many workers as runs, at most the CPU cores and `AUTO_MAX`); sequential for a
smaller pair, whose runs are shorter than a worker's start-up, and on the CPU,
where the cores are what the runs themselves use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.graphs.modes import EAGER
from parity.harness.workers import cpu_count, sendable

GIB = 1 << 30
# A worker's own device memory beside its runs: the CUDA context, cuBLAS workspaces and loaded kernels.
WORKER_OVERHEAD = {"cuda": 1 * GIB, "cpu": 64 << 20}
AUTO_MAX = 8
# The default goes concurrent only for pairs this large: a smaller pair's runs last less than a worker's start-up
# (a spawned process imports torch and transformers: seconds), and the GPU test suite runs many small sessions.
AUTO_MIN_WEIGHTS = 1 * GIB


@dataclass(frozen=True)
class Job:
    name: str           # the run's name: a mode, or `ref:<mode>`
    mode: str
    reference: bool
    bytes: int          # what the plan gives the run beyond the weights


@dataclass
class Concurrency:
    jobs: int                    # runs at once (1: one after another, in this process)
    requested: int | None        # --jobs (None: the default)
    reason: str
    weights: int = 0
    budget: int | None = None
    overhead: int = 0            # each worker's own memory

    @property
    def concurrent(self) -> bool:
        return self.jobs > 1

    def room(self) -> int | None:
        """Bytes the runs in flight may hold together (None: no budget known)."""
        if self.budget is None:
            return None
        return self.budget - self.weights - self.jobs * self.overhead

    def as_dict(self) -> dict:
        return {"jobs": self.jobs, "requested": self.requested, "concurrent": self.concurrent, "reason": self.reason,
                "worker_overhead_bytes": self.overhead}


def session_jobs(modes, reference_of: dict[str, str], plan) -> list[Job]:
    """Every run of a session, the eager-style ones first (at scale they are launch-bound and the longest)."""
    def size(mode: str) -> int:
        return plan.modes[mode].run_bytes if plan is not None and mode in plan.modes else 0
    def reference(mode: str) -> int:
        return plan.reference_run(mode) if plan is not None and mode in plan.modes else 0
    jobs = [Job(EAGER, EAGER, False, size(EAGER))]
    for mode, name in reference_of.items():
        if name not in [j.name for j in jobs]:
            jobs.append(Job(name, mode, True, reference(mode)))    # eager's run and its padding probe
    return jobs + [Job(m, m, False, size(m)) for m in modes if m != EAGER]


def decide(plan, requested: int | None, jobs: list[Job], device: torch.device, *sent) -> Concurrency:
    """The width of a session and why; `sent` are what a spawned worker must receive besides the pair."""
    device = torch.device(device)
    if requested == 1:
        return Concurrency(1, requested, "sequential (--jobs 1)")
    if len(jobs) < 2:
        return Concurrency(1, requested, "sequential: a single run")
    if requested is None and device.type != "cuda":
        return Concurrency(1, requested, "sequential: the default on the CPU (--jobs N runs N at once)")
    if plan is None or plan.budget is None:
        return Concurrency(1, requested, "sequential: no memory plan to fit concurrent runs in")
    if requested is None and plan.weights < AUTO_MIN_WEIGHTS:
        return Concurrency(1, requested, f"sequential: the default for a pair under {AUTO_MIN_WEIGHTS / GIB:g} GiB, "
                                         f"whose runs are shorter than a worker's start-up (--jobs N runs N at once)")
    why = sendable(*sent)
    if why is not None:
        return Concurrency(1, requested, f"sequential: {why}")
    cap = min(requested or min(AUTO_MAX, cpu_count()), len(jobs))
    overhead = WORKER_OVERHEAD[device.type]
    smallest = sorted(j.bytes for j in jobs)
    width = cap
    while width > 1 and plan.weights + width * overhead + sum(smallest[:width]) > plan.budget:
        width -= 1
    if width < 2:
        return Concurrency(1, requested, f"sequential: two runs at once do not fit the plan's budget "
                                         f"({plan.budget / GIB:.1f} GiB, {plan.budget_source})")
    fitted = "" if width == cap else f" (the plan's budget fits {width} of {cap})"
    share = "CUDA IPC" if device.type == "cuda" else "shared memory"
    return Concurrency(width, requested, f"concurrent: up to {width} runs at once{fitted} in worker processes "
                                         f"sharing the weights through {share}",
                       plan.weights, plan.budget, overhead)
