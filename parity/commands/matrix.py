"""The mutation matrix (`parity faults matrix`): every catalogued fault injected, every mode run, through
`parity run` itself."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from parity.builders.synth.build import synthesize
from parity.builders.synth.spec import TARGET_FOLDER, SynthRequest
from parity.commands import run_args
from parity.commands.boundary import run_command
from parity.faults.catalog import FAULTS, SCENARIOS, home_scenario
from parity.graphs.modes import MODES
from parity.harness.forked import fork_map, forkable


def run_matrix(model: str = "tiny-llama3-eagle", backend: str = "emulated", names=None,
               scenarios_dir: Path = SCENARIOS, progress=None, extra: tuple[str, ...] = (),
               jobs: int | None = None) -> dict[str, dict]:
    """Run each fault on its home scenario in every mode; returns fault name -> summary, in catalog order.

    A fault that needs another head (the catalog's `head`: the MTP faults) runs on a tiny synth pair of that
    head (`tiny_pair`) instead of `model`.

    Each fault runs `parity run` in a process of its own: a fault that drives a
    CUDA kernel out of bounds poisons its process, and must not poison the next.
    On the emulated backend that process is a child forked from this one
    (`harness.forked`: no second import of torch); on CUDA, or once this process
    has initialised CUDA (neither survives a fork), a fresh interpreter. `extra`:
    more `parity run` arguments (`--dtype bfloat16 --simulate-padding-numerics 0.1`). `jobs` processes run at
    once (default: one per CPU core), each on one CPU thread unless OMP_NUM_THREADS
    says otherwise: oversubscribed OpenMP threads spin for minutes.
    """
    names = list(names or FAULTS)
    jobs = jobs or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        pairs = {head: tiny_pair(head, Path(tmp) / "pairs" / head.replace(" ", ""))
                 for head in dict.fromkeys(FAULTS[name].head for name in names) if head}

        def argv(name: str) -> list[str]:
            head = FAULTS[name].head
            pair = ["--model", model] if not head else \
                ["--model", "local", "--target-path", str(pairs[head][0]), "--draft-path", str(pairs[head][1])]
            return ["run", *pair, "--backend", backend,
                    "--scenario", str(home_scenario(FAULTS[name], scenarios_dir)), "--modes", ",".join(MODES),
                    "--inject", name, "--out", str(Path(tmp) / name), "--quiet", *extra,
                    *(["--tp", str(FAULTS[name].tp)] if FAULTS[name].tp > 1 else []), *FAULTS[name].args]

        def summary(name: str, code: int, output: str) -> dict:
            out = Path(tmp) / name
            if code not in (0, 1) or not (out / "summary.json").is_file():
                raise RuntimeError(f"{name}: parity run exited {code}: {output.strip()[-400:]}")
            return json.loads((out / "summary.json").read_text())

        done = (lambda name, _: progress(name)) if progress is not None else None
        if backend == "emulated" and forkable():
            # `parity run`'s own module, imported once here, not in every child (the command line imports it only
            # as the command runs).
            importlib.import_module("parity.commands.run")
            return dict(zip(names, fork_map(lambda name: summary(name, *_in_process(argv(name))), names, jobs,
                                            on_result=done)))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        with ThreadPoolExecutor(jobs) as pool:
            def one(name: str) -> dict:
                ran = subprocess.run([sys.executable, "-m", "parity", *argv(name)], capture_output=True, text=True,
                                     env=env)
                result = summary(name, ran.returncode, ran.stderr)
                if done is not None:
                    done(name, result)
                return result

            return dict(zip(names, pool.map(one, names)))


def tiny_pair(head: str, out: Path) -> tuple[Path, Path]:
    """(target, draft) folders of `parity models synth --shape tiny --head <head>` written into `out`: acceptance
    0.8, seed 0, float32, on the CPU (a few seconds). `head` is the catalog's: "mtp-deepseek [--mtp-layers N]",
    "eagle1 --hybrid"."""
    words = head.split()
    layers = int(words[words.index("--mtp-layers") + 1]) if "--mtp-layers" in words else 1
    hybrid = 2 if "--hybrid" in words else 0
    synthesize(SynthRequest("tiny", words[0], 0.8, "float32", str(out), 0, "cpu", layers, hybrid),
               progress=lambda _: None)
    return out / TARGET_FOLDER, out / words[0]


def _in_process(argv: list[str]) -> tuple[int, str]:
    """`parity <argv>` in this (forked) process, on one CPU thread: (exit code, what it printed)."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = run_command(argv, (run_args,))
    return code, err.getvalue()


def matrix_rows(results: dict[str, dict]) -> list[list[str]]:
    """One row per fault: the name, then per mode '-' (pass) or the diagnosed kind and buffers."""
    rows = []
    for name, summary in results.items():
        row = [name]
        for mode in MODES:
            if mode not in summary.get("modes", {}):   # a TP run stopped before any rank's verdict
                run = summary.get("diagnosis") or {}
                row.append(f"{run['kind']}({','.join(run['buffers'])})" if run.get("mode") == mode else "not run")
                continue
            verdict = summary["modes"][mode]["verdict"]
            if verdict in ("pass", "not_exercised"):
                row.append("-" if verdict == "pass" else "NOT_EXERCISED")
                continue
            d = summary.get("diagnoses", {}).get(mode)
            row.append(f"{d['kind']}({','.join(d['buffers'])})" if d else "drift")
        rows.append(row)
    return rows
