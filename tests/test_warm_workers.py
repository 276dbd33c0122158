"""Workers started with the process (`harness/warm.py`): who gets them, and that unused ones end."""

from __future__ import annotations

import pytest

from parity.harness import warm


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(warm, "_has_gpu", lambda: True)
    monkeypatch.setattr(warm, "_cpus", lambda: 16)


def test_only_a_likely_concurrent_run_starts_workers(gpu, tmp_path, monkeypatch):
    big, small = tmp_path / "big", tmp_path / "small"
    big.mkdir(), small.mkdir()
    with open(big / "model.safetensors", "wb") as f:
        f.truncate(warm.AUTO_MIN_BYTES)              # sparse: the size counts, not the bytes
    (small / "model.safetensors").write_bytes(b"0" * 16)
    for folder in (big, small):
        (folder / "config.json").write_text("{}")
    local = ["run", "--model", "local", "--draft-path", str(small)]
    assert warm.expected([*local, "--target-path", str(big)]) == warm.AUTO_MAX
    assert warm.expected([*local, f"--target-path={big}", "--modes", "all"]) == warm.AUTO_MAX
    assert warm.expected([*local, "--target-path", str(small)]) == 0      # a small pair runs one after another
    assert warm.expected(["run"]) == 0                                     # the embedded tiny pair
    monkeypatch.setenv("PARITY_LLAMA3_EAGLE_TARGET_PATH", str(big))         # a zoo pair found where the run looks
    monkeypatch.setenv("PARITY_LLAMA3_EAGLE_DRAFT_PATH", str(small))
    assert warm.expected(["run", "--model", "llama3-eagle"]) == warm.AUTO_MAX
    assert warm.expected(["run", "--target-path", str(big)]) == 0         # refused by the run: no guess
    assert warm.expected(["run", "--jobs", "3"]) == 3
    assert warm.expected([*local, "--target-path", str(big), "--jobs", "1"]) == 0
    assert warm.expected([*local, "--target-path", str(big), "--tp", "2"]) == 0
    assert warm.expected([*local, "--target-path", str(big), "--backend", "emulated"]) == 0
    assert warm.expected([*local, "--target-path", str(big), "--plan"]) == 0
    assert warm.expected(["run", "--help"]) == 0
    assert warm.expected(["bench", "scale", "--target-path", str(big)]) == 0
    assert warm.expected([]) == 0


def test_a_bench_scale_that_runs_a_session_asks_for_mps(gpu):
    assert warm.bench_run(["bench", "scale", "--target-path", "t", "--draft-path", "d"])
    assert warm.bench_run(["bench", "scale", "--jobs", "4"])
    for args in (["--skip-run"], ["--run-summary", "s.json"], ["--jobs", "1"], ["--help"]):
        assert not warm.bench_run(["bench", "scale", *args]), args
    assert not warm.bench_run(["bench", "latency"]) and not warm.bench_run(["run"]) and not warm.bench_run([])


def test_no_gpu_no_workers(monkeypatch):
    monkeypatch.setattr(warm, "_has_gpu", lambda: False)
    assert warm.expected(["run", "--jobs", "4"]) == 0


@pytest.mark.costly     # two interpreters importing torch: seconds of CPU
def test_started_workers_are_taken_or_let_go():
    warm.start(2)
    taken = warm.take()
    assert taken is not None
    warm.release()
    assert warm.take() is None
    process, conn = taken
    conn.close()                     # the pool's end closed: the worker ends without a run
    process.join(120)
    assert process.exitcode == 0
