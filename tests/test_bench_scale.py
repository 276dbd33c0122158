"""`parity bench scale` and the default `parity bench` steps, on what a CPU can run.

The CUDA-only measurements (copy bandwidth, profiler kernel times) are stood
in for; everything around them (engines per batch with graphs of exactly that
batch, interleaved timing, rows, the run breakdown from a summary, the
tables) runs for real on the emulated backend.
"""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

import parity.harness.bench_scale as bench_scale
from parity.harness.bench_scale import run_figures, scale_forwards, time_scale_run, weight_bytes
from parity.harness.clean_alarms import clean_alarms, shipped_scenarios
from parity.scripts.gpu_scale import Steps, report
from parity.harness.request import RunRequest
from parity.models.pair import load_pair
from parity.report.bench import alarms_line, forwards_table, run_table


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny-llama3-eagle")


def test_forwards_are_timed_after_a_warm_up_of_the_same_loop(monkeypatch):
    import time

    from parity.harness import bench

    calls = {"eager": 0, "full": 0}

    class Forward:
        def __init__(self, mode):
            self.mode = mode

        def call(self):
            calls[self.mode] += 1

    monkeypatch.setattr(bench, "WARMUP_S", 0.05)
    start = time.perf_counter()
    medians = bench.interleaved_medians({m: Forward(m) for m in calls}, torch.device("cpu"), iters=4)
    assert time.perf_counter() - start >= 0.05
    assert calls["eager"] == calls["full"] >= 3 + 4 and set(medians) == set(calls)


def test_scale_forwards_rows(pair, monkeypatch):
    monkeypatch.setattr("parity.harness.bench.WARMUP_S", 0.0)
    monkeypatch.setattr(bench_scale, "hbm_bandwidth", lambda device: 1e9)
    monkeypatch.setattr(bench_scale, "gpu_kernels", lambda call, device: (call(), (7, 0.5))[1])
    figures = scale_forwards(pair, torch.device("cpu"), batches=(1, 4), iters=2, max_model_len=64,
                             backend="emulated")
    rows = figures["forwards"]
    assert [(r["phase"], r["batch"]) for r in rows] == [(p, b) for b in (1, 4)
                                                        for p in ("verify", "draft_prefill", "draft_step")]
    assert all(r["runtime"] == "full" and r["kernels"] == 7 and r["eager_ms"] > 0 and r["queued_ms"] > 0
               for r in rows)
    # The floor counts the weights each graph read: all of the target's but its embedding table for verify; the
    # head's own and the lm_head (shared with the target here) for the drafter, fc included (EAGLE-1 runs it inside
    # the drafter's graphs).
    weights = weight_bytes(pair)
    target, head = pair.target.hf, pair.head
    verify = weights["target"] - target.model.embed_tokens.weight.nbytes
    draft = weights["head"] + head.lm_head.weight.nbytes
    assert head.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr() and head.fc.weight.nbytes > 0
    assert [r["weights_read"] for r in rows] == [verify, draft, draft] * 2
    assert rows[0]["floor_ms"] == pytest.approx(verify / 1e9 * 1e3, rel=1e-3)
    Console(width=120, file=open("/dev/null", "w")).print(forwards_table(figures))


def test_the_floor_leaves_out_what_the_drafter_graph_never_reads(monkeypatch):
    monkeypatch.setattr("parity.harness.bench.WARMUP_S", 0.0)
    """EAGLE-3's fc runs eagerly before the drafter's graphs: its weight is no part of their floor."""
    monkeypatch.setattr(bench_scale, "hbm_bandwidth", lambda device: 1e9)
    monkeypatch.setattr(bench_scale, "gpu_kernels", lambda call, device: (call(), (7, 0.5))[1])
    pair = load_pair("tiny-llama3-eagle3")
    rows = scale_forwards(pair, torch.device("cpu"), batches=(1,), iters=1, max_model_len=64,
                          backend="emulated")["forwards"]
    draft = weight_bytes(pair)["head"] - pair.head.fc.weight.nbytes
    assert pair.head.fc.weight.nbytes > 0 and [r["weights_read"] for r in rows[1:]] == [draft, draft]


def test_run_breakdown_from_a_run(tmp_path):
    figures = time_scale_run(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"),
                                        "emulated", bisect=False))
    assert figures["verdict"] == "pass" and figures["wall_seconds"] > 0 and figures["load_seconds"] >= 0
    assert set(figures["runs"]) == {"eager", "full", "ref:full"}
    assert figures["runs"]["full"]["capture_seconds"] > 0 and figures["runs"]["full"]["plan_bytes"] > 0
    assert figures["runs"]["ref:full"]["plan_bytes"] is None
    # One after another (the CPU default): eager, full, then the reference bounds the wall; concurrency 1.
    spans = [(figures["runs"][n]["start_seconds"], figures["runs"][n]["end_seconds"]) for n in ("eager", "full",
                                                                                                  "ref:full")]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    path = figures["concurrency"]["critical_path"]
    assert (path["bounded_by"], path["path"], path["concurrency"]) == ("ref:full", ["eager", "full", "ref:full"], 1.0)
    console = Console(width=120, record=True, file=open("/dev/null", "w"))
    console.print(run_table(figures))
    text = console.export_text()
    assert "ref:full" in text and "bounded by ref:full" in text


def test_bench_scale_reads_a_saved_run(tmp_path, capsys, monkeypatch):
    from parity.cli import main

    out = tmp_path / "run"
    assert main(["run", "--modes", "eager,full", "--backend", "emulated", "--quiet", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    figures = run_figures(summary)
    assert figures["runs"]["full"]["verdict"] == "pass" and figures["wall_seconds"] is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "scale", "--run-summary", str(out / "summary.json")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    steps = Steps(tmp_path, budget=3)
    assert steps.run("late", ["true"], cap=60) == "skipped"
    text = report(steps, out / "summary.json", tmp_path / "missing.json",
                  {"stale-slot-mapping": out / "summary.json", "reassign-seq-lens": tmp_path / "none.json"})
    assert "late" in text and "skipped" in text and "(unexpected)" in text and "ref:full" in text and "PASS" in text
    assert "--inject stale-slot-mapping: PASS (eager PASS, full PASS); no diagnosis" in text
    assert "--inject reassign-seq-lens: no summary.json" in text


def test_gpu_scale_without_cuda_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    from parity.scripts import gpu_scale

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert gpu_scale.main([]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "needs one CUDA GPU" in lines[0] and "nothing was run" in lines[0]
    assert captured.out == "" and not (tmp_path / "out").exists()


def test_the_false_alarm_bench_runs_the_shipped_scenarios_but_the_real_scale_ones():
    """Which scenarios the alarms step runs (its verdicts and numerics: test_default_bench_audit_and_false_alarms)."""
    names = {p.stem for p in shipped_scenarios()}
    assert "default" in names and not names & {"llama3-eagle", "long-context-8k"}


def test_no_false_alarm_on_the_synthetic_tiny_shape(tmp_path):
    """The false-alarm bench on a synthetic pair (what `parity bench --alarm-shape tiny` builds)."""
    from parity.builders.synth.build import synthesize
    from parity.builders.synth.spec import TARGET_FOLDER, SynthRequest

    synthesize(SynthRequest("tiny", "eagle1", 0.8, "bfloat16", str(tmp_path / "pair"), 0, "cpu"), progress=print)
    result = clean_alarms(paths=[shipped_scenarios()[0]], seeds=1, requests=2, max_tokens=8,
                          pair_paths=(str(tmp_path / "pair" / TARGET_FOLDER), str(tmp_path / "pair" / "eagle1")),
                          model="synthetic tiny")
    assert result["mode_runs"] == 4 and result["false_alarms"] == 0
    assert result["max_abs_logprob_diff"] > 0, "the seam moved the padded references"
    assert alarms_line(result).startswith("clean-engine false alarms (synthetic tiny, bfloat16, padding numerics x0.1")


def bench(tmp_path, *args) -> dict:
    from parity.cli import main

    assert main(["bench", "--json", str(tmp_path / "bench.json"), *args]) == 0
    return json.loads((tmp_path / "bench.json").read_text())


# `make bench` on the CPU, every default step, split so each test keeps within its budget; make test keeps the
# audit and analysis steps, make test-costly the rest.
@pytest.mark.costly
def test_default_bench_latency_parity_and_a_bisection(tmp_path):
    """The bisection on one fault (its time is a benchmark figure, not asserted here; `make bench` bisects every
    fault). 30 s on the 2-core machine: make test-costly."""
    report = bench(tmp_path, "--skip", "audit,alarms,analysis", "--iters", "5", "--faults", "reassign-seq-lens")
    assert set(report) >= {"latency", "parity", "bisect"}
    assert [(r["fault"], r["kind"]) for r in report["bisect"]] == [("reassign-seq-lens", "BUFFER_REASSIGNED")]


@pytest.mark.slow
def test_default_bench_audit_and_analysis(tmp_path):
    """The audit's overhead and the analysis at the 8B session's shape, as `make bench` reports them."""
    report = bench(tmp_path, "--skip", "latency,parity,bisect,alarms")
    assert set(report) >= {"audit", "analysis"} and "alarms" not in report
    assert report["analysis"]["runs"] == 8 and report["analysis"]["requests"] == 32    # the 8B session's shape


@pytest.mark.costly
def test_default_bench_false_alarms_over_every_shipped_scenario(tmp_path):
    """Every shipped scenario, one seed, in every graph mode: the verdicts pass while the padded references move
    against eager (the run the one-scenario false-alarm test made before is one of these rows). A minute and a
    half on the 2-core machine: make test-costly."""
    report = bench(tmp_path, "--skip", "latency,parity,bisect,audit,analysis", "--alarm-requests", "2",
                   "--alarm-tokens", "8")
    alarms = report["alarms"]
    assert alarms["mode_runs"] == 4 * len(shipped_scenarios()) and alarms["false_alarms"] == 0
    assert max(r["max_abs_logprob_diff"] for r in alarms["rows"] if r["scenario"] == "default") > 0, \
        "the seam moved the padded references"
    assert f"0/{alarms['mode_runs']}" in alarms_line(alarms)


@pytest.mark.parametrize("args, needle", [(["--skip", "bogus"], "--skip bogus: not a step of parity bench"),
                                          (["--faults", "no-such-fault"], "--faults: unknown fault(s) no-such-fault")])
def test_bench_refuses_unknown_steps_and_faults_in_one_line(capsys, args, needle):
    from parity.cli import main

    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_kernel_profile_groups_by_name_most_time_first():
    from parity.scripts.kernel_profile import format_groups, group_kernels

    groups = group_kernels([("gemm", 5.0), ("copy", 1.0), ("gemm", 7.0), ("x" * 100, 2.0)], width=10)
    assert groups == [("gemm", 2, 12.0), ("x" * 10, 1, 2.0), ("copy", 1, 1.0)]
    text = format_groups("verify batch 1", groups, top=2)
    assert text.splitlines()[0] == "verify batch 1: 4 kernels, 0.01 ms" and "copy" not in text


def test_kernel_profile_lists_kernels_in_launch_order():
    from parity.scripts.kernel_profile import format_order

    text = format_order("draft_step batch 8", [("embed", 2.0), ("gemv", 70.5), ("embed", 1.5)], width=4)
    assert text.splitlines() == ["draft_step batch 8: 3 kernels in launch order, 0.074 ms", "    2.00 us  embe",
                                 "   70.50 us  gemv", "    1.50 us  embe"]


def test_kernel_profile_without_cuda_says_so_in_one_line(capsys, monkeypatch):
    from parity.scripts import kernel_profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kernel_profile.main([]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "needs one CUDA GPU" in lines[0]
