"""The emulated pools place blocks where the CUDA caching allocator does.

Both backends capture the tiny pair's graphs into one shared pool (the
shared-pool-alias configuration). On CUDA the allocator's own history gives
every block allocated in a graph pool; on the emulated backend the pool's
placements are logged. The two sequences of (rounded size, offset in its
segment) must be the same: then a drafter temporary lands on a target output
on one backend exactly when it does on the other, and the fault matrix cannot
drift between them. Which of two equally free segments a block goes to
depends on raw addresses, so segments are not compared.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parity.engine.config import EngineConfig
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs import emulated
from parity.graphs.factory import install_graphs
from parity.graphs.policy import CapturePolicy
from parity.models.pair import load_pair
from parity.harness.scenario import load_scenario

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
ROUND = 512


def _capture(device: str, backend: str, mode: str) -> None:
    scenario = load_scenario(ROOT / "scenarios" / "s004-dedicated-pool.yaml")
    pair = load_pair("tiny-llama3-eagle", device=device)
    engine = SpecDecodeEngine(pair.target, pair.head, EngineConfig.of(scenario), device)
    install_graphs(engine, mode, backend, policy=CapturePolicy(shared_drafter_pool=True))


def cuda_placements(mode: str) -> list[tuple[int, int]]:
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    try:
        _capture("cuda", "cuda", mode)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    pools = [(s["address"], s["total_size"]) for s in snapshot["segments"]
             if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0)]
    placements = []
    for event in (e for trace in snapshot["device_traces"] for e in trace):
        if event["action"] != "alloc":
            continue
        base = next((b for b, size in pools if b <= event["addr"] < b + size), None)
        if base is not None:
            placements.append((max(ROUND, -(-event["size"] // ROUND) * ROUND), event["addr"] - base))
    return placements


def emulated_placements(mode: str, monkeypatch) -> list[tuple[int, int]]:
    placements = []
    allocate = emulated.EmulatedPool.allocate_like

    def logged(pool, out):
        placed = allocate(pool, out)
        offset = placed.storage_offset() * placed.element_size() - out.storage_offset() * out.element_size()
        placements.append((max(ROUND, -(-out.untyped_storage().nbytes() // ROUND) * ROUND), offset))
        return placed

    monkeypatch.setattr(emulated.EmulatedPool, "allocate_like", logged)
    _capture("cpu", "emulated", mode)
    return placements


@pytest.mark.parametrize("mode", ["full_decode_only", "full", "piecewise"])
def test_emulated_pool_places_blocks_where_cuda_does(mode, monkeypatch):
    on_cuda = cuda_placements(mode)
    on_cpu = emulated_placements(mode, monkeypatch)
    assert len(on_cuda) > 100
    first = next((i for i, (a, b) in enumerate(zip(on_cuda, on_cpu)) if a != b), None)
    assert len(on_cuda) == len(on_cpu) and first is None, (
        f"{len(on_cuda)} blocks on cuda, {len(on_cpu)} emulated; first difference at block {first}: "
        f"cuda {on_cuda[first] if first is not None else None}, emulated {on_cpu[first] if first is not None else None}")
