"""`parity bench scale`: a real-shape pair in bf16 on one GPU (parity/harness/bench_scale.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from parity.commands.common import console
from parity.commands.options import EXIT_PASS
from parity.errors import ParityInputError
from parity.harness.bench_scale import run_figures, scale_forwards, time_scale_run
from parity.harness.release import reclaim
from parity.harness.request import RunRequest, resolve_dtype
from parity.models.pair import load_pair
from parity.report.bench import forwards_table, run_table


def scale(args) -> int:
    """The run's breakdown (measured here or read from a summary), then the per-forward figures."""
    if not torch.cuda.is_available():
        raise ParityInputError("parity bench scale measures a pair on a GPU: CUDA is not available here")
    device = torch.device("cuda")
    report: dict = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(device), "model": args.model,
                    "target_path": args.target_path, "draft_path": args.draft_path, "dtype": args.dtype}
    if not args.skip_run:
        report["run"] = _run(args)
        console().print(run_table(report["run"]))
    if not args.skip_forwards:
        batches = tuple(int(b) for b in args.batches.split(",") if b.strip())
        pair = load_pair(args.model, target_path=args.target_path, draft_path=args.draft_path,
                         dtype=resolve_dtype(args.dtype, False, device), device=device)
        torch.cuda.reset_peak_memory_stats(device)
        report["forwards"] = scale_forwards(pair, device, batches, args.forward_iters, args.max_model_len)
        report["forwards"]["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        del pair
        reclaim(device)
        console().print(forwards_table(report["forwards"]))
    path = Path(args.scale_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {path}")
    return EXIT_PASS


def _run(args) -> dict:
    if args.run_summary:
        try:
            summary = json.loads(Path(args.run_summary).read_text())
        except (OSError, ValueError) as exc:
            raise ParityInputError(f"--run-summary {args.run_summary}: cannot read it ({exc})") from None
        return run_figures(summary)
    request = RunRequest(args.model, args.scenario, None, "cuda", target_path=args.target_path,
                         draft_path=args.draft_path, dtype=args.dtype, bisect=False, jobs=args.jobs)
    return time_scale_run(request)
