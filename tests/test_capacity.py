"""The capacity audit: every persistent buffer holds every padded shape a mode runs at, checked before capture."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.cli import main
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs.capacity import ShortBuffers, shortfalls
from parity.graphs.factory import dispatcher_for, install_graphs, install_padded_reference
from parity.graphs.manager import GraphExecutor
from parity.graphs.modes import MODES
from tests.conftest import engine_config

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parent.parent


def make_engine(pair, **config) -> SpecDecodeEngine:
    target, head = pair
    return SpecDecodeEngine(target, head, engine_config(**config), CPU)


@settings(max_examples=40, deadline=None)
@given(mode=st.sampled_from(MODES), k=st.integers(1, 4), max_num_seqs=st.integers(1, 9),
       extra_tokens=st.integers(0, 40),
       sizes=st.none() | st.lists(st.integers(1, 96), min_size=1, max_size=6, unique=True).map(sorted))
def test_a_correct_engine_fits_every_padded_shape(random_pair, mode, k, max_num_seqs, extra_tokens, sizes):
    """No false alarm: the engine's own buffers hold whatever the dispatcher pads to, for any capture sizes."""
    engine = make_engine(random_pair, num_speculative_tokens=k, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_seqs * (1 + k) + extra_tokens)
    for owner in engine.owners():
        assert shortfalls(owner, dispatcher_for(engine, owner, mode, sizes)) == []


def test_a_buffer_one_row_short_is_named_before_anything_is_captured(random_pair):
    engine = make_engine(random_pair, max_num_seqs=3)
    drafter = engine.owner("drafter")
    drafter.buffers.rebind("query_start_loc", torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ShortBuffers) as caught:
        install_graphs(engine, "full", "emulated")
    [short] = caught.value.shortfalls
    assert (short.owner, short.buffer, short.capacity, short.needed) == ("drafter", "query_start_loc", 3, 4)
    assert short.num_reqs == 3 and short.runtime_mode == "full"
    assert "drafter.query_start_loc holds 3 entries" in str(caught.value)
    assert not any(isinstance(o.executor, GraphExecutor) for o in engine.owners()), "nothing was captured"


def test_a_short_token_buffer_is_named_at_the_smallest_padded_size_it_cannot_hold(random_pair):
    engine = make_engine(random_pair, max_num_seqs=3, max_num_batched_tokens=64)
    target = engine.owner("target")
    target.buffers.rebind("positions", torch.zeros(10, dtype=torch.int64))
    with pytest.raises(ShortBuffers) as caught:
        install_graphs(engine, "piecewise", "emulated", capture_sizes=(1, 2, 4, 8, 16, 32, 64))
    [short] = caught.value.shortfalls
    assert (short.owner, short.buffer, short.capacity, short.needed, short.num_tokens) == \
        ("target", "positions", 10, 16, 16)


def test_the_padded_reference_refuses_the_same_shapes(random_pair):
    """The reference runs eagerly at the graphs' padded shapes: the same slices, the same refusal."""
    engine = make_engine(random_pair, max_num_seqs=3)
    engine.owner("target").buffers.rebind("seq_lens", torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ShortBuffers) as caught:
        install_padded_reference(engine, "full_decode_only")
    assert [(s.owner, s.buffer) for s in caught.value.shortfalls] == [("target", "seq_lens")]


def test_eager_pads_nothing_and_is_never_refused(random_pair):
    engine = make_engine(random_pair, max_num_seqs=3)
    engine.owner("target").buffers.rebind("seq_lens", torch.zeros(2, dtype=torch.int64))
    assert install_graphs(engine, "eager", "emulated") == {}


def test_parity_run_reports_a_refused_mode_in_every_output(tmp_path, capsys):
    """The user's path, end to end: DRIFT, 'not run' in both tables, the buffer in the panel and the JSON."""
    out = tmp_path / "run"
    code = main(["run", "--scenario", str(ROOT / "scenarios" / "s002-padded-drafter.yaml"), "--modes", "eager,full",
                 "--backend", "emulated", "--inject", "query-start-loc-one-short", "--out", str(out)])
    assert code == 1
    text = capsys.readouterr().out
    assert "not run" in text and "SHORT_BUFFER" in text and "before capture, draft_prefill, drafter" in text
    summary = json.loads((out / "summary.json").read_text())
    full = summary["modes"]["full"]
    assert full["verdict"] == "drift" and full["num_output_tokens"] == 0 and full["forwards_by_runtime_mode"] == {}
    [short] = full["short_buffers"]
    assert (short["owner"], short["buffer"], short["capacity"], short["needed"]) == ("drafter", "query_start_loc",
                                                                                     8, 9)
    assert summary["diagnosis"]["kind"] == "SHORT_BUFFER" and summary["diagnosis"]["step"] is None
    assert "**not run**" in (out / "report.md").read_text()
    assert set(pd.read_parquet(out / "records.parquet")["mode"]) == {"eager"}, "a refused mode has no records"
