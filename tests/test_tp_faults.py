"""The registered all-reduce and its two TP faults (docs/tp.md), on two CPU processes (gloo, emulated graphs).

The mechanism first, on two forked ranks: a captured registered all-reduce replays the live sum while its buffer
is the one registered, and, once the buffer is registered anew after capture, replays the sum the new buffer
holds (what the ranks last staged eagerly), not the sum of what it staged. Then the user's path, `parity run
--tp 2 --tp-all-reduce registered`: the workspace fault NAMED in full (make test); PASS bitwise per rank in every
mode, and each fault DRIFT in exactly the modes the catalog lists and NAMED there, the same on every rank
(costly: a whole scenario per test).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parity.faults.catalog import FAULTS
from parity.graphs.modes import MODES
from parity.harness.tp_session import TpLaunch, init_rank
from parity.models import tp
from parity.models.tp_registered import SLOT_TOKENS, RegisteredAllReduce
from tests.robustkit import call
from tests.test_tp import assert_named

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "tp-registered.yaml"
TP_FAULTS = ("tp-all-reduce-buffer-rebound", "tp-workspace-reallocated")
pytestmark = pytest.mark.usefixtures("warm_forked_children")


def _rebound_rank(rank: int, folder: str) -> None:
    """Capture a registered row-parallel layer, replay it, register its buffer anew, replay again."""
    from parity.graphs.emulated import EmulatedBackend

    ctx = init_rank(rank, TpLaunch(2, False, Path(folder), 30.0, "registered"))
    comm = RegisteredAllReduce(tp.GROUP, 1, 3, torch.float32, torch.device("cpu"), ctx)
    layer = tp.RowParallelLinear(torch.eye(3), None)
    layer.comm, layer.key, layer.out = comm, 0, comm.register(0)      # as `tp.register_all_reduce` does
    x = torch.full((2, 3), float(rank + 1))
    backend = EmulatedBackend(torch.device("cpu"))
    recorder = backend.begin(backend.new_pool("t"))
    out = layer(x)
    segment = backend.end(recorder)
    found = {"ops": [str(op[0]) for op in segment.ops], "captured": out.tolist()}
    x.copy_(torch.full((2, 3), 10.0 * (rank + 1)))
    segment.replay()
    found["replayed"] = out.tolist()
    layer.out = comm.register(0)                                 # registered anew after capture
    found["eager"] = layer(torch.full((2, 3), 100.0 * (rank + 1))).tolist()   # stages into the new buffer
    segment.replay()                                             # stages 10s and 20s into the old one
    found["stale"] = out.tolist()
    # A call larger than a slot takes the backend's collective (as custom all-reduces fall back to NCCL).
    found["large"] = layer(torch.full((SLOT_TOKENS + 1, 3), float(rank + 1))).unique().tolist()
    Path(folder, f"r{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()
    tp.deactivate()


def test_a_registered_all_reduce_replays_the_registered_buffer_not_the_captured_one(tmp_path):
    mp.start_processes(_rebound_rank, args=(str(tmp_path),), nprocs=2, start_method="fork")
    for rank in range(2):
        found = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert "parity.registered_all_reduce_.default" in found["ops"], found["ops"]
        assert found["captured"] == [[3.0] * 3] * 2          # 1 + 2
        assert found["replayed"] == [[30.0] * 3] * 2         # 10 + 20: the live inputs, through the buffer
        assert found["eager"] == [[300.0] * 3] * 2           # 100 + 200 through the buffer registered now
        # The graph staged 10 and 20 into the buffer it captured and read every rank's registered one, where the
        # eager call left its sum (the reduction is in place): 300 + 300, not 10 + 20.
        assert found["stale"] == [[600.0] * 3] * 2
        assert found["large"] == [3.0]


def test_the_manifest_keeps_every_view_cut_from_a_workspace_as_the_capture_began():
    """A graph reads a buffer cut from a workspace at the place it had when the capture began: the manifest holds
    that view (and every other view of the storage), not what the attribute holds once the capture ended."""
    from parity.graphs.manifest import build_manifest, object_tensors

    owner = type("Owner", (), {})()
    owner.heap = torch.zeros(8)
    owner.a, owner.b = owner.heap[0:4], owner.heap[4:8]
    held = object_tensors(owner)
    owner.a = owner.heap[4:8]           # re-cut right after the capture
    entries = build_manifest({owner.heap.untyped_storage().data_ptr()}, [], None, held)
    assert {e.name: (e.tensor.storage_offset(), tuple(e.shape)) for e in entries} == {
        "heap": (0, (8,)), "a": (0, (4,)), "b": (4, (4,))}


def _run(tmp: Path, *extra: str, modes: str = "all") -> tuple[int, dict, Path]:
    out = tmp / "run"
    code, _, err = call(["run", "--tp", "2", "--tp-all-reduce", "registered", "--backend", "emulated",
                         "--scenario", str(SCENARIO), "--modes", modes, "--out", str(out), "--quiet",
                         "--tp-timeout", "20", *extra])
    assert code in (0, 1), err
    return code, json.loads((out / "summary.json").read_text()), out


@pytest.mark.costly
def test_the_registered_all_reduce_passes_bitwise_per_rank_in_every_mode(tmp_path):
    code, summary, out = _run(tmp_path)
    assert code == 0 and summary["verdict"] == "pass"
    for rank in ("0", "1"):
        ranked = json.loads((out / "ranks" / f"rank{rank}" / "summary.json").read_text())
        assert set(ranked["modes"]) == set(MODES)
        for mode, m in ranked["modes"].items():
            if mode != "eager":
                assert m["reference"]["bitwise_equal"] and m["graph_replays"] > 0, (rank, mode)


@pytest.mark.parametrize("fault", TP_FAULTS)
def test_each_registered_buffer_fault_is_named_in_full(fault, tmp_path):
    """The first layer's buffer re-registered after capture: that view, handed back to the reference at its captured
    place, restores parity. Every buffer re-cut from the heap after the first capture: no one view does, all of
    them together do: the heap (the workspace) and every view are named. The same on every rank."""
    code, summary, out = _run(tmp_path, "--inject", fault, modes="full")
    assert code == 1 and summary["verdict"] == "drift"
    assert_named(fault, summary, out, ["full"])
    views = [b for b in summary["diagnosis"]["buffers"] if b.endswith(".out")]
    if fault == "tp-workspace-reallocated":
        assert len(views) == 4 and "together" in summary["diagnosis"]["experiment"]
    else:
        assert views == ["model.hf.model.layers.0.self_attn.o_proj.out"]


@pytest.mark.costly
@pytest.mark.parametrize("fault", TP_FAULTS)
def test_each_registered_buffer_fault_is_named_in_its_modes_on_every_rank(fault, tmp_path):
    assert FAULTS[fault].args == ("--tp-all-reduce", "registered") and FAULTS[fault].scenario == SCENARIO.stem
    code, summary, out = _run(tmp_path, "--inject", fault)
    assert code == 1 and summary["verdict"] == "drift" and summary["faults"] == [fault]
    for rank, entry in summary["tp"]["ranks"].items():
        drifting = {m for m, v in entry["modes"].items() if v == "drift"}
        assert drifting == set(FAULTS[fault].manifests_in) and entry["modes"]["eager"] == "pass", (rank, entry)
    assert_named(fault, summary, out, FAULTS[fault].manifests_in)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("fault", (None, *TP_FAULTS))
def test_gpu_registered_all_reduce(fault):
    with tempfile.TemporaryDirectory() as tmp:
        code, summary, out = _run(Path(tmp), "--backend", "cuda", *(["--inject", fault] if fault else []),
                                  modes="all" if fault is None else "full")
        ranks = summary["tp"]["ranks"].values()
        if fault is None:
            assert code == 0 and all(e["verdict"] == "pass" for e in ranks)
        else:
            assert code == 1 and all(e["modes"]["full"] == "drift" for e in ranks)
            assert_named(fault, summary, out, ["full"])
