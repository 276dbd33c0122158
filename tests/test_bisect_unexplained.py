"""A drift no one-variable experiment explains is UNEXPLAINED with its localisation, never a guess."""

from __future__ import annotations

import json


from parity.graphs.capture import CapturedGraph
from parity.harness.request import RunRequest
from parity.harness.session import run_session
from parity.report.artifacts import write_run
from parity.report.writers import RUN_REPORT_WRITERS


def test_unexplained_drift_is_unknown_with_localisation(tmp_path, monkeypatch):
    replay = CapturedGraph.replay

    def corrupted(self, meta):
        outputs = replay(self, meta)
        if self.runtime_mode == "full" and outputs and outputs[0].dim() == 2 and outputs[0].shape[-1] > 100:
            outputs[0][:, 7] += 50.0   # a kernel bug inside the target graph: no buffer, no capture value
        return outputs

    monkeypatch.setattr(CapturedGraph, "replay", corrupted)
    out = tmp_path / "run"
    outcome = run_session(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"), "emulated"))
    write_run(out, outcome.summary, outcome.runs, extra_writers=RUN_REPORT_WRITERS)
    assert outcome.summary["modes"]["full"]["verdict"] == "drift"
    diagnosis = outcome.summary["diagnosis"]
    assert diagnosis["kind"] == "UNEXPLAINED" and diagnosis["buffers"] == []
    assert diagnosis["phase"] == "verify" and diagnosis["step"] is not None and diagnosis["owner"] == "target"
    assert any("inside the captured graph" in line for line in diagnosis["evidence"])
    saved = json.loads((out / "diagnosis.json").read_text())
    assert saved["kind"] == "UNEXPLAINED" and "full" in saved["by_mode"]


def test_a_tiny_kernel_difference_is_a_drift_not_noise(tmp_path, monkeypatch):
    """One graph-only rounding difference, tokens unchanged: bitwise against the reference, so DRIFT."""
    replay = CapturedGraph.replay

    def jittered(self, meta):
        outputs = replay(self, meta)
        if self.runtime_mode == "full" and outputs and outputs[0].dim() == 2 and outputs[0].shape[-1] > 100:
            outputs[0].mul_(1.0005)   # like another kernel inside the graph: tiny deltas, same argmax
        return outputs

    monkeypatch.setattr(CapturedGraph, "replay", jittered)
    outcome = run_session(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"), "emulated"))
    full = outcome.summary["modes"]["full"]
    assert full["verdict"] == "drift" and full["tokens_equal_to_eager"]
    assert not full["reference"]["bitwise_equal"]
    assert full["reference"]["first_difference"]["field"] in ("logprob", "target_logprob")
    assert outcome.summary["diagnosis"]["kind"] == "UNEXPLAINED"


def test_changed_target_logits_are_pool_alias_only_when_the_drafter_replay_alone_overwrites_them(monkeypatch):
    """The POOL_ALIAS decision (the replay experiment itself runs in the fault matrix, shared-pool-alias)."""
    from types import SimpleNamespace

    from parity.diagnose import pool
    from parity.diagnose.bisector import Bisector

    bisector = SimpleNamespace(mode="full", replays=1)
    bisector.diagnosis = lambda *a, **k: Bisector.diagnosis(bisector, *a, **k)
    verify = SimpleNamespace(owner="target", step=3, phase="verify", draft_step=None, index=9)
    drafter = SimpleNamespace(draft_step=0, dispatch=SimpleNamespace(phase="draft_prefill", runtime_mode="full",
                                                                     num_tokens_padded=8))
    unseen = pool.diagnose(bisector, None, verify, None, 2.5, None)
    assert unseen.kind == "UNEXPLAINED" and any("no drafter replay" in e for e in unseen.evidence)
    for overwrites, kind in ((False, "UNEXPLAINED"), (True, "POOL_ALIAS")):
        monkeypatch.setattr(pool, "_overwrites_again", lambda *a, overwrites=overwrites: overwrites)
        d = pool.diagnose(bisector, None, verify, drafter, 2.5, None)
        assert d.kind == kind and d.max_abs_diff == 2.5
        if overwrites:
            assert d.buffers == ["logits"] and "draft_prefill full graph of 8 tokens alone" in d.experiment
        else:
            assert d.experiment is None and d.buffers == [] and "logits stay as restored" in d.ruled_out[0]
