"""The MTP faults of the catalog strike where they should, fast: on the tiny random MTP heads of test_mtp.py.

The mutation matrix (tests/test_mutation_matrix.py) runs them through `parity run` on their home scenarios
and checks what the diagnosis names; here only the mechanism: the frozen layer index changes a multi-layer head's
drafts in a graph mode and nothing in eager or with one layer; unskipped padded rows change drafts only when
the drafter's batch is padded.
"""

from __future__ import annotations

import pytest

from conftest import engine_config, make_specs
from parity.engine.spec_decode import SpecDecodeEngine
from parity.faults import seam
from parity.graphs.factory import install_graphs
from parity.models.mtp import DEEPSEEK, QWEN3NEXT
from test_mtp import random_head, target  # noqa: F401 - the module fixture

COLUMNS = ["step", "req_id", "draft_index", "draft_token", "draft_logprob"]


def run(target, head, specs, faults=(), mode=None):
    parts, policy = seam.apply(faults)
    # room for 4 rows: a batch of 3 decoding rows replays the graph captured for 4
    engine = SpecDecodeEngine(target, head, engine_config(max_num_seqs=4), parts=parts)
    if mode is not None:
        install_graphs(engine, mode, "emulated", policy=policy)
    return engine.run(specs).drafts[COLUMNS].reset_index(drop=True)


@pytest.mark.parametrize("layout", [DEEPSEEK, QWEN3NEXT])
def test_frozen_layer_index_strikes_multi_layer_heads_under_graphs_only(target, layout):
    specs = make_specs(2, seed=5, max_tokens=6, max_prompt=8)
    fault = ("mtp-layer-index-frozen",)
    multi = random_head(target, layout, 3)
    clean = run(target, multi, specs)
    assert run(target, multi, specs, fault).equals(clean)                       # eager reads the host step right
    assert not run(target, multi, specs, fault, "full").equals(run(target, multi, specs, (), "full"))  # layer 0
    single = random_head(target, layout, 1)
    assert run(target, single, specs, fault, "full").equals(run(target, single, specs, (), "full"))


def test_unskipped_padded_rows_strike_only_padded_batches(target):
    head = random_head(target, DEEPSEEK, 1)
    fault = ("mtp-padded-rows-not-skipped",)
    three = make_specs(3, seed=5, max_tokens=6, max_prompt=8, stagger=0)
    assert run(target, head, three, fault).equals(run(target, head, three))  # eager: never padded
    assert not run(target, head, three, fault, "full").equals(run(target, head, three, (), "full"))
