"""CAPTURE_ERROR and WRONG_GRAPH through the user's path, `parity run` (and `parity gate`), on the emulated
backend: a verdict of the mode (exit 1 like a drift, never an internal error), the other modes still run, the run
folder is complete, and the diagnosis names the engine's line or both graphs."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from parity.faults.catalog import FAULTS
from tests.robustkit import call, complete_run, tiny_scenario


BACKENDS = ["emulated", pytest.param("cuda", marks=pytest.mark.gpu)]


def run(tmp_path, fault: str, modes: str, backend: str = "emulated") -> tuple[int, str, dict]:
    out = tmp_path / "run"
    code, stdout, err = call(["run", "--scenario", str(tiny_scenario(tmp_path)), "--backend", backend, "--quiet",
                              "--modes", modes, "--inject", fault, "--out", str(out)])
    assert "internal error" not in err and "Traceback" not in err, err
    assert complete_run(out), sorted(p.name for p in out.iterdir())
    return code, stdout, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_host_sync_in_the_captured_forward_is_a_capture_error_at_the_engine_line(tmp_path, backend):
    code, text, summary = run(tmp_path, "logits-item-in-capture", "eager,piecewise,full", backend)
    assert code == 1 and summary["verdict"] == "drift"
    assert summary["modes"]["eager"]["verdict"] == "pass"
    [line] = FAULTS["logits-item-in-capture"].buffers
    for mode in ("piecewise", "full"):
        m = summary["modes"][mode]
        assert m["verdict"] == "drift" and m["num_output_tokens"] == 0
        error = m["capture_error"]
        assert (error["owner"], error["phase"], error["runtime_mode"], error["source"]) == (
            "target", "verify", mode, line)
        assert ".item()" in error["code"] and error["function"] == "LogitsOfLiveTokens.logits"
        d = summary["diagnoses"][mode]
        assert d["kind"] == "CAPTURE_ERROR" and d["buffers"] == [line, "LogitsOfLiveTokens.logits"]
        assert d["step"] is None
        assert d["phase"] == "verify" and d["experiment"]
    assert "not run" in text and "CAPTURE_ERROR" in text and re.search(rf"\bsource +{re.escape(line)}", text)
    assert "at capture, verify, target" in text
    report = (tmp_path / "run" / "report.md").read_text()
    assert "**not run**" in report and "CAPTURE_ERROR" in report and line in report
    recorded = set(pd.read_parquet(tmp_path / "run" / "records.parquet")["mode"])
    assert "eager" in recorded and not {"piecewise", "full"} & recorded, "a refused mode has no records"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graph_of_another_phase_stops_the_mode_before_it_replays_and_is_named(tmp_path, backend):
    # Piecewise, one request: the draft step's 1-token batch pads to 4 tokens, and so can the draft prefill's.
    code, text, summary = run(tmp_path, "graph-key-ignores-phase", "eager,piecewise,full", backend)
    assert code == 1 and summary["verdict"] == "drift"
    assert summary["modes"]["eager"]["verdict"] == "pass" and summary["modes"]["full"]["verdict"] == "pass"
    m = summary["modes"]["piecewise"]
    wrong = m["wrong_graph"]
    assert m["verdict"] == "drift" and wrong["differs"] == ["phase"] and wrong["step"] == 0
    assert (wrong["replayed"]["phase"], wrong["wanted"]["phase"]) == ("draft_prefill", "draft_step")
    assert wrong["replayed"]["num_tokens"] == wrong["wanted"]["num_tokens"] == 4
    d = summary["diagnoses"]["piecewise"]
    assert (d["kind"], d["buffers"], d["phase"], d["step"]) == ("WRONG_GRAPH", ["phase"], "draft_step", 0)
    assert "restored" in " ".join(d["evidence"]) and d["experiment"].startswith("capture the drafter draft_step")
    assert "stopped" in text and "WRONG_GRAPH" in text and "draft_prefill" in text
    assert "**stopped**" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.parametrize("fault, check", [("logits-item-in-capture", "capture"),
                                          ("graph-key-ignores-phase", "replay check")])
def test_the_gate_fails_with_a_check_of_its_own(tmp_path, fault, check):
    code, _, err = call(["gate", "--scenario", str(tiny_scenario(tmp_path)), "--backend", "emulated",
                         "--modes", "eager,piecewise", "--inject", fault, "--out", str(tmp_path / "gate")])
    assert code == 1, err
    gate = json.loads((tmp_path / "gate" / "summary.json").read_text())["gate"]
    failed = [c for c in gate["result"]["checks"] if not c["passed"]]
    assert [c["reference"] for c in failed] == [check], failed
