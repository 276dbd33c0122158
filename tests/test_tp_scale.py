"""The CPU twin of `python -m parity.scripts.tp_scale` (the 70B TP=2 check): the tiny shape generated at load,
two gloo ranks on the emulated backend, the same steps and expectations (PASS, a TP fault's DRIFT, a planted
rank divergence ending as RANK_DIVERGENCE), and what the at-load generator draws: a rank's slices of the very
model TP=1 draws."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from parity.builders.synth.at_load import generate_pair, write_recipe
from parity.models import tp
from parity.models.zoo import get_entry
from parity.scripts import tp_scale
from tests.robustkit import call

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("warm_forked_children")


def test_a_rank_draws_its_slices_of_the_model_tp1_draws(tmp_path):
    write_recipe(tmp_path, "tiny", "eagle1", 0, 1e-4, torch.float32)
    args = (get_entry("local"), tmp_path / "target", tmp_path / "eagle1", torch.float32, torch.device("cpu"))
    whole = generate_pair(*args)
    for rank in range(2):
        tp.activate(tp.TpContext(rank, 2, timedelta(seconds=1)), None)
        try:
            part = generate_pair(*args)
        finally:
            tp.deactivate()
        expected = tp.shard_target(generate_pair(*args).target, rank, 2).hf.state_dict()
        got = part.target.hf.state_dict()
        assert set(got) == set(expected)
        assert all(torch.equal(got[k], expected[k]) for k in got), rank
        assert all(torch.equal(a, b) for a, b in zip(part.head.state_dict().values(), whole.head.state_dict().values()))


def test_the_cpu_twin_of_the_70b_check(tmp_path):
    def in_process(argv, log):
        code, out, err = call(argv)
        log.write_text(out + err)
        return code

    code = tp_scale.main(["--shape", "tiny", "--backend", "emulated", "--dtype", "float32", "--scenario",
                          str(ROOT / "scenarios" / "tp-short.yaml"), "--modes", "full", "--tp-timeout", "20",
                          "--out", str(tmp_path)], launcher=in_process)
    summary = (tmp_path / "summary.txt").read_text()
    assert code == 0, summary
    assert "five-modes: exit 0" in summary and "rank-divergence: exit 1" in summary and "RANK_DIVERGENCE" in summary
    assert "peak GiB per rank {'rank0': None, 'rank1': None}" in summary    # no device memory on the CPU
    # The TP fault: each rank's FULL graphs drift (the all-reduce spreads rank 1's stale seq_lens), eager passes.
    fault = json.loads((tmp_path / "run-inject-tp-seq-lens-rank0-only" / "summary.json").read_text())
    assert all(r["modes"] == {"eager": "pass", "full": "drift"} for r in fault["tp"]["ranks"].values())


def test_the_70b_shape_is_the_published_one_and_writes_no_weights(tmp_path):
    from parity.builders.synth.spec import SHAPES, target_config
    from parity.models import memory

    config = target_config(SHAPES["llama3-70b"])
    assert memory.target_params(config) == 70_553_706_496          # Meta-Llama-3-70B
    code, out, _ = call(["models", "synth", "--shape", "llama3-70b", "--head", "eagle1", "--at-load",
                         "--out", str(tmp_path / "p")])
    assert code == 0 and "--at-load" not in out
    files = sorted(p.name for p in (tmp_path / "p").rglob("*") if p.is_file())
    assert not [f for f in files if f.endswith(".safetensors")] and "generate.json" in files
    code, _, err = call(["models", "synth", "--shape", "llama3-70b", "--head", "eagle3", "--at-load",
                         "--out", str(tmp_path / "q")])
    assert code == 2 and "only --head eagle1" in err
