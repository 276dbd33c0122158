"""One rank of a tensor-parallel `parity run`, and the run's verdict from every rank's.

Every rank runs the same session (the same scenario, schedule, modes and
padded references, in the same order: the scheduler is deterministic), each
on its slices of the target (`models.tp`) and the whole drafter. Each graph
forward is first agreed with the peers (`graphs.rank_guard`); every
collective runs under the run's timeout. A rank's outcome is its own
verdict; the run's is their conjunction, and a divergence or a stalled rank
is the run's verdict RANK_DIVERGENCE (docs/tp.md).
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from parity.diagnosis.kinds import RANK_DIVERGENCE
from parity.graphs.rank_guard import RankDivergence, RankGuard
from parity.harness.request import RunRequest
from parity.harness.session import RunOutcome, run_session
from parity.models import tp


@dataclass(frozen=True)
class TpLaunch:
    """How the ranks of one run meet: their number, the collectives' backend, a folder they share, a timeout."""

    world: int
    cuda: bool
    folder: Path              # the rendezvous store and each rank's result live here
    timeout_s: float
    all_reduce: str = "collective"   # the row-parallel all-reduce: "collective" or "registered" (models.tp)


def init_rank(rank: int, launch: TpLaunch) -> tp.TpContext:
    """Join the process group (gloo on the CPU, NCCL on GPUs, one GPU per rank) and make this process a rank."""
    timeout = timedelta(seconds=launch.timeout_s)
    if launch.cuda:
        torch.cuda.set_device(rank)
    else:   # the ranks share the CPU cores: oversubscribed OpenMP threads spin instead of working
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // launch.world))
    store = dist.FileStore(str(launch.folder / "store"), launch.world)
    store.set_timeout(timeout)
    dist.init_process_group("nccl" if launch.cuda else "gloo", store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=launch.world, timeout=timeout)
    ctx = tp.TpContext(rank, launch.world, timeout, store=dist.PrefixStore("descriptors", store),
                       all_reduce=launch.all_reduce)
    tp.activate(ctx, dist.group.WORLD)
    # NOTE: the first collective creates NCCL's communicator: never inside a graph capture.
    probe = torch.ones(1, device="cuda" if launch.cuda else "cpu")
    dist.all_reduce(probe)
    return ctx


def rank_request(request: RunRequest) -> RunRequest:
    """The request every rank runs: its graph runners agree each forward with the peers, its bisection each
    decision (`graphs.tp_agree`: the ranks run the same experiments in the same order, so their collectives
    pair up); its runs one after another."""
    policy = request.policy
    guarded = type(f"RankGuarded{policy.executor.__name__}", (RankGuard, policy.executor), {})
    # One run at a time (jobs=1): a rank's runs all take part in its collectives, which worker processes outside
    # the process group could not.
    return dataclasses.replace(request, policy=dataclasses.replace(policy, executor=guarded), jobs=1)


def run_rank(rank: int, launch: TpLaunch, request: RunRequest) -> tuple[dict, RunOutcome | None]:
    """This rank's session: (status, outcome). Status `ok`, `divergence` (with what parted) or `error`.

    The process group stays up: the caller reports first, then `leave(launch)` (a rank whose peer stalled
    must not wait on it again to tear the group down).
    """
    outcome = None
    try:
        init_rank(rank, launch)
        outcome = run_session(rank_request(request))
        status = {"status": "ok", "verdict": outcome.summary["verdict"]}
    except RankDivergence as divergence:
        status = {"status": "divergence", **divergence.as_dict()}
    except Exception as exc:     # a collective that timed out, or a bug: the run's verdict says which
        status = {"status": "error", "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                  "traceback": traceback.format_exc(limit=8)}
    return {"rank": rank, **status}, outcome


def leave(launch: TpLaunch) -> None:
    """Leave the process group after reporting. NOTE: on NCCL, destroying a group whose collectives were
    captured in CUDA graphs can hang (pytorch#115388): the process just ends, and the launcher ends it if not."""
    if dist.is_initialized() and not launch.cuda:
        dist.destroy_process_group()
    tp.deactivate()


def run_verdict(world: int, statuses: dict[int, dict], summaries: dict[int, dict]) -> dict:
    """The TP run's summary: rank 0's, with every rank's verdict under `tp`; pass only if every rank passes.

    A rank that parted from the others, or never reported, makes the verdict RANK_DIVERGENCE.
    """
    ranks = {r: _rank_entry(statuses.get(r), summaries.get(r)) for r in range(world)}
    base = dict(summaries.get(0) or next(iter(summaries.values()), {}))
    divergence = _divergence(world, statuses)
    passed = divergence is None and all(e["verdict"] == "pass" for e in ranks.values())
    base.update(verdict="pass" if passed else "drift",
                tp={"world": world, "ranks": {str(r): e for r, e in ranks.items()},
                    "sharding": "column-parallel q/k/v and gate/up, row-parallel o_proj and down_proj with one "
                                "all-reduce each; embedding, final norm, lm_head and drafter replicated"})
    if divergence is not None:
        base["diagnosis"] = divergence
    return base


def _rank_entry(status: dict | None, summary: dict | None) -> dict:
    if status is None:
        return {"verdict": "no report", "status": "stalled"}
    modes = {m: v["verdict"] for m, v in (summary or {}).get("modes", {}).items()}
    verdict = status.get("verdict", "drift") if status["status"] == "ok" else status["status"]
    return {"verdict": verdict, "status": status["status"], "modes": modes,
            **({"error": status["error"]} if "error" in status else {})}


def _divergence(world: int, statuses: dict[int, dict]) -> dict | None:
    """RANK_DIVERGENCE from the first rank that saw one; a rank that never reported counts as stalled."""
    seen = next((s for r, s in sorted(statuses.items()) if s["status"] == "divergence"), None)
    silent = [r for r in range(world) if r not in statuses]
    if seen is None and not silent:
        return None
    if seen is None:
        seen = {"rank": silent[0], "forward": None, "mode": None, "stalled": True, "descriptors": {},
                "message": f"rank {silent[0]} never reported within the timeout"}
    return {"kind": RANK_DIVERGENCE, "buffers": ["descriptor"], "rank": seen["rank"], "forward": seen["forward"],
            "mode": seen["mode"], "stalled": seen["stalled"], "descriptors": seen["descriptors"],
            "evidence": [seen["message"]], "phase": None, "step": None}
