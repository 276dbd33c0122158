"""`parity bench scale`: a real-shape pair in bf16 on one GPU (parity/harness/bench_scale.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from parity.commands.common import console
from parity.commands.options import EXIT_PASS, count
from parity.errors import ParityInputError
from parity.harness.bench_scale import run_figures, scale_forwards, time_scale_run
from parity.harness.release import reclaim
from parity.harness.request import RunRequest, resolve_dtype
from parity.models.pair import load_pair
from parity.models.zoo import LOCAL_MODEL
from parity.report.bench import forwards_table, run_table


def register_scale(suites) -> None:
    sc = suites.add_parser("scale", help="a real-shape pair on one GPU: eager vs FULL per forward, kernels, the "
                                         "weight-read floor, and a whole run's time and memory")
    sc.add_argument("--model", default=LOCAL_MODEL, help="zoo name (default: the pair at --target/--draft-path)")
    sc.add_argument("--target-path", default=None)
    sc.add_argument("--draft-path", default=None)
    sc.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    sc.add_argument("--scenario", default="scenarios/llama3-eagle.yaml", help="the scenario run in every mode")
    sc.add_argument("--run-summary", default=None, metavar="SUMMARY_JSON",
                    help="take the run's figures from a `parity run` folder's summary.json instead of running")
    sc.add_argument("--skip-run", action="store_true", help="forwards only")
    sc.add_argument("--jobs", type=count, default=None, metavar="N",
                    help="runs of the whole run at once (1: one after another; default: as `parity run`)")
    sc.add_argument("--no-mps", action="store_true", help="the run's concurrent workers without a private MPS "
                                                            "daemon (as `parity run --no-mps`)")
    sc.add_argument("--skip-forwards", action="store_true", help="the run only")
    sc.add_argument("--batches", default="1,8,32", help="batch sizes of the per-forward figures")
    sc.add_argument("--max-model-len", type=count, default=512)
    sc.add_argument("--forward-iters", type=count, default=20, help="timed iterations per forward")
    sc.add_argument("--json", dest="scale_json", default="reports/bench-scale.json",
                    help="where to write every figure")


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
