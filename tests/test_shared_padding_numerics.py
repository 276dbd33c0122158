"""A bug of the padded shapes that the graph and its reference share and that reads no padded entry: the fixed
bound catches it, and the diagnosis says PADDING_NUMERICS with what was ruled out, never a buffer no experiment
isolated. (A bug that decides "padded" by reading a padded query_start_loc entry is named query_start_loc.)"""

from __future__ import annotations

import parity.models.paged_attention as paged_attention
from parity.harness.request import RunRequest
from parity.harness.session import run_session


def test_a_shared_padded_shape_bug_that_reads_no_padding_is_padding_numerics(monkeypatch):
    attend = paged_attention.attention_core

    def scaled_when_padded(module, query, key, value, scaling, meta):
        out = attend(module, query, key, value, scaling, meta)
        # the bug: a kernel variant picked for power-of-two token counts (the capture sizes) rescales its output
        tokens = query.shape[2]
        return out * 1.5 if tokens & (tokens - 1) == 0 else out

    monkeypatch.setattr(paged_attention, "attention_core", scaled_when_padded)
    summary = run_session(RunRequest("tiny-llama3-eagle", "scenarios/s002-padded-drafter.yaml", ("eager", "full"),
                                     "emulated")).summary
    full = summary["modes"]["full"]
    assert full["reference"]["bitwise_equal"] and full["verdict"] == "drift", full["reasons"]
    assert full["numerics"]["max_abs_logprob_diff"] > full["numerics"]["bound"]
    d = summary["diagnoses"]["full"]
    assert (d["kind"], d["buffers"]) == ("PADDING_NUMERICS", []), d
    assert any("INERT padded entry" in r for r in d["ruled_out"]), d["ruled_out"]
