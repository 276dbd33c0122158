"""`parity run --check-unpadded`: eager against the same requests run one at a time, in one line."""

from __future__ import annotations

from parity.engine.metadata import MetadataBuilder
from parity.harness.request import RunRequest
from parity.harness.session import run_session


def run(**kw):
    return run_session(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"), "emulated",
                                  check_unpadded=True, bisect=False, **kw)).summary


def test_a_clean_engine_agrees_with_its_unpadded_single_request_run():
    u = run()["unpadded"]
    assert not u["engine_wrong"] and u["max_abs_logprob_diff"] <= u["bound"], u
    assert u["line"].startswith("eager agrees with an unpadded single-request run")


def test_a_bug_every_mode_shares_is_called_the_engines(monkeypatch):
    """Every row's seq_len is the batch's shortest: batched eager, the graph and its reference are all wrong alike,
    and only a request run alone is right."""
    fill = MetadataBuilder._fill

    def coupled(self, name, values, pad, num_tokens):
        fill(self, name, [min(values)] * len(values) if name == "seq_lens" and values else values, pad, num_tokens)

    monkeypatch.setattr(MetadataBuilder, "_fill", coupled)
    summary = run()
    u = summary["unpadded"]
    assert u["engine_wrong"] and u["references_agreeing_with_eager"] == ["ref:full"], u
    assert "the engine is wrong in every mode, not the graphs" in u["line"]
    assert summary["modes"]["full"]["verdict"] == "pass"
