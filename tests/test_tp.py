"""Tensor parallelism (docs/tp.md): `parity run --tp 2` on two CPU processes (gloo, emulated graphs).

The all-reduce is an op the emulated recorder captures and replays on the live input; the tiny pair passes
bitwise per rank in every mode; each TP fault is found through `parity run --tp 2 --inject F` (here and in the
CPU twin of the 70B check, tests/test_tp_scale.py, which runs tp-seq-lens-rank0-only) and NAMED by the bisection
every rank runs in lockstep (the registered-buffer faults: tests/test_tp_faults.py); a rank that parts from its
peers (another descriptor, or none) ends the run as RANK_DIVERGENCE, never a hang.
"""

from __future__ import annotations

import json
import re
import time
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parity.errors import ParityInputError
from parity.faults.catalog import FAULTS
from parity.graphs.rank_guard import RankDivergence, agree
from parity.harness.tp_session import TpLaunch, init_rank, run_verdict
from parity.models import tp
from tests.robustkit import call

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "tp-short.yaml"
pytestmark = pytest.mark.usefixtures("warm_forked_children")


def _replay_rank(rank: int, folder: str) -> None:
    """Capture a function holding the all-reduce on the emulated backend, then replay it on new inputs."""
    from parity.graphs.emulated import EmulatedBackend

    init_rank(rank, TpLaunch(2, False, Path(folder), 30.0))
    backend = EmulatedBackend(torch.device("cpu"))
    x = torch.full((3,), float(rank + 1))
    recorder = backend.begin(backend.new_pool("t"))
    out = tp.all_reduce(x * 2, tp.GROUP)
    segment = backend.end(recorder)
    ops = [str(op[0]) for op in segment.ops]
    x.copy_(torch.full((3,), 10.0 * (rank + 1)))
    segment.replay()
    Path(folder, f"r{rank}.json").write_text(json.dumps({"ops": ops, "out": out.tolist()}))
    dist.destroy_process_group()


def test_the_all_reduce_is_recorded_as_one_op_and_replays_the_live_input(tmp_path):
    mp.start_processes(_replay_rank, args=(str(tmp_path),), nprocs=2, start_method="fork")
    for rank in range(2):
        found = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert "parity.all_reduce.default" in found["ops"], found["ops"]
        # Captured: 2*1 + 2*2 = 6; replayed on the inputs written after capture: 2*10 + 2*20 = 60.
        assert found["out"] == [60.0] * 3


def test_heads_that_do_not_divide_are_refused_in_one_line():
    with pytest.raises(ParityInputError, match="num_attention_heads = 4 does not divide over 3"):
        tp.shard_config(type("C", (), {"num_attention_heads": 4, "num_key_value_heads": 2,
                                       "intermediate_size": 384, "hidden_size": 128})(), 3)
    code, _, err = call(["run", "--tp", "3", "--backend", "emulated", "--scenario", str(SCENARIO)])
    assert code == 2 and err.count("\n") == 1 and "does not divide over 3 ranks" in err


def test_a_rank_runs_its_modes_one_after_another_and_bisects_them():
    # Worker processes of a concurrent session are outside the process group: a rank's runs must stay in it.
    from parity.graphs.modes import MODES
    from parity.harness.request import RunRequest
    from parity.harness.tp_session import rank_request

    ranked = rank_request(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", MODES, "cuda", jobs=None))
    assert ranked.jobs == 1 and ranked.bisect and "RankGuard" in ranked.policy.executor.__name__


def test_tp1_is_the_engine_of_today():
    """No TP context: loading shards nothing, and the target holds no all-reduce."""
    from parity.models.pair import load_pair

    assert tp.current() is None
    pair = load_pair("tiny-llama3-eagle")
    assert tp.shard_if_parallel(pair.target) is pair.target
    assert not any(isinstance(m, tp.RowParallelLinear) for m in pair.target.modules())


def _run(tmp_path: Path, *extra: str, modes: str = "all") -> tuple[int, dict, Path]:
    out = tmp_path / "run"
    code, _, err = call(["run", "--tp", "2", "--backend", "emulated", "--scenario", str(SCENARIO), "--modes", modes,
                         "--out", str(out), "--quiet", "--tp-timeout", "20", *extra])
    assert code in (0, 1), err
    return code, json.loads((out / "summary.json").read_text()), out


def test_tp2_passes_bitwise_per_rank_in_every_mode(tmp_path):
    code, summary, out = _run(tmp_path)
    assert code == 0 and summary["verdict"] == "pass"
    for rank in ("0", "1"):
        entry = summary["tp"]["ranks"][rank]
        assert entry["verdict"] == "pass"
        assert set(entry["modes"]) == {"eager", "piecewise", "full", "full_decode_only", "full_and_piecewise"}
        ranked = json.loads((out / "ranks" / f"rank{rank}" / "summary.json").read_text())
        for mode, m in ranked["modes"].items():
            if mode != "eager":
                assert m["reference"]["bitwise_equal"] and m["graph_replays"] > 0, (rank, mode)
    assert (out / "records.parquet").is_file() and (out / "report.md").is_file()


def assert_named(fault: str, summary: dict, out: Path, modes) -> None:
    """Every mode `fault` shows in is NAMED with its catalogued kind and buffers, the same on every rank, by an
    experiment; the run's summary and diagnosis.json carry rank 0's."""
    expected = FAULTS[fault]
    ranked = [json.loads((out / "ranks" / f"rank{r}" / "summary.json").read_text()) for r in range(2)]
    for mode in modes:
        found = [r["diagnoses"][mode] for r in ranked]
        assert found[0]["kind"] == expected.kind and set(expected.buffers) <= set(found[0]["buffers"]), found[0]
        assert found[0]["experiment"] and found[0]["phase"] is not None, found[0]
        assert all((f["kind"], f["buffers"], f["evidence"]) == (found[0]["kind"], found[0]["buffers"],
                                                                  found[0]["evidence"]) for f in found)
    assert summary["diagnosis"]["kind"] == expected.kind
    assert json.loads((out / "diagnosis.json").read_text())["buffers"] == summary["diagnosis"]["buffers"]


def test_seq_lens_refreshed_on_rank_zero_only_is_named(tmp_path):
    """Rank 1's seq_lens goes stale in its FULL graphs; the all-reduce spreads it to rank 0. Both ranks bisect in
    lockstep, try rank 1's repair on both (a no-op on rank 0), and name it alike."""
    code, summary, out = _run(tmp_path, "--inject", "tp-seq-lens-rank0-only", modes="full")
    assert code == 1 and summary["verdict"] == "drift"
    assert_named("tp-seq-lens-rank0-only", summary, out, ["full"])
    assert "on rank 1 only" in " ".join(summary["diagnosis"]["evidence"])


def test_ranks_whose_bisections_decide_apart_end_as_rank_divergence(tmp_path, monkeypatch):
    """A decision every rank must take alike, taken apart (here: rank 1 alone sees the graph's shape differ from the
    padding), stops the bisection on both ranks: RANK_DIVERGENCE naming the decision and both values, no hang."""
    from parity.diagnose import descriptor
    from parity.graphs.rank_guard import tp_rank

    monkeypatch.setattr(descriptor, "shape_differs", lambda dispatch, entry: tp_rank() == 1)   # the forked ranks see it
    began = time.monotonic()
    code, summary, _ = _run(tmp_path, "--inject", "tp-seq-lens-rank0-only", modes="full")
    d = summary["diagnosis"]
    assert code == 1 and d["kind"] == "RANK_DIVERGENCE" and d["rank"] == 1 and not d["stalled"]
    assert "graph shape differs from the padding" in d["evidence"][0]
    assert d["descriptors"] == {"rank 0": "false", "rank 1": "true"}
    assert time.monotonic() - began < 60


def test_a_rank_padding_to_another_size_ends_as_rank_divergence(tmp_path):
    code, summary, out = _run(tmp_path, "--inject", "tp-rank-pads-up", modes="full")
    d = summary["diagnosis"]
    assert code == 1 and summary["verdict"] == "drift" and d["kind"] == "RANK_DIVERGENCE"
    assert d["rank"] == 1 and not d["stalled"] and d["mode"] == "full"
    padded = {r: int(re.search(r"tokens=\d+->(\d+)", text).group(1)) for r, text in d["descriptors"].items()}
    assert padded["rank 1"] > padded["rank 0"], d["descriptors"]
    assert json.loads((out / "diagnosis.json").read_text())["kind"] == "RANK_DIVERGENCE"
    assert (out / "ranks").is_dir()


def test_a_stalled_rank_ends_the_run_as_rank_divergence_within_the_timeout(tmp_path):
    began = time.monotonic()
    code, summary, out = _run(tmp_path, "--inject", "tp-rank-stalls", "--tp-timeout", "4", modes="full")
    d = summary["diagnosis"]
    assert code == 1 and d["kind"] == "RANK_DIVERGENCE" and d["rank"] == 1 and d["stalled"]
    assert summary["tp"]["ranks"]["1"]["status"] == "stalled"       # killed by the launcher, never reported
    assert time.monotonic() - began < 120


def test_a_rank_that_never_posts_is_named_within_the_timeout(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 2)
    tp.activate(tp.TpContext(0, 2, timedelta(seconds=1), store=store), None)
    try:
        with pytest.raises(RankDivergence) as stalled:
            agree("full", "target/verify full tokens=4->8")
        assert stalled.value.rank == 1 and stalled.value.found is None
        store.set("1/1", "target/verify full tokens=4->16")     # rank 1 posts another descriptor next
        with pytest.raises(RankDivergence) as parted:
            agree("full", "target/verify full tokens=4->8")
        assert (parted.value.rank, parted.value.found) == (1, "target/verify full tokens=4->16")
        assert parted.value.forward == 1      # this run's second forward
    finally:
        tp.deactivate()


def test_a_rank_that_never_reports_makes_the_run_rank_divergence():
    summary = run_verdict(2, {0: {"rank": 0, "status": "ok", "verdict": "pass"}}, {0: {"modes": {}}})
    assert summary["verdict"] == "drift" and summary["diagnosis"]["kind"] == "RANK_DIVERGENCE"
    assert summary["diagnosis"]["rank"] == 1 and summary["diagnosis"]["stalled"]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("fault,expect", [(None, "pass"), ("tp-seq-lens-rank0-only", "named"),
                                          ("tp-rank-pads-up", "RANK_DIVERGENCE"), ("tp-rank-stalls", "RANK_DIVERGENCE")])
def test_gpu_tp2(fault, expect):
    with tempfile.TemporaryDirectory() as tmp:
        code, summary, out = _run(Path(tmp), "--backend", "cuda", *(["--inject", fault] if fault else []),
                                  modes="all" if fault is None else "full")
        if expect == "named":
            assert code == 1 and summary["verdict"] == "drift"
            assert_named(fault, summary, out, ["full"])
    if expect == "pass":
        assert code == 0 and all(e["verdict"] == "pass" for e in summary["tp"]["ranks"].values())
    elif expect == "RANK_DIVERGENCE":
        assert summary["diagnosis"]["kind"] == expect and summary["diagnosis"]["rank"] == 1
