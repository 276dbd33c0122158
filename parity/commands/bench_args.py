"""`parity bench`'s arguments, its suites' (scale, false-alarms) included. Light (no torch): its `--help` and
a bad flag answer at once; the command itself, bench.py, is imported only when it runs."""

from __future__ import annotations

from parity.builders.synth.spec import SHAPES
from parity.commands.bench_steps import STEPS
from parity.commands.options import Parser, count, non_negative, runs
from parity.models.zoo import LOCAL_MODEL


def register(sub) -> None:
    p = sub.add_parser("bench", help="side-by-side latency ratios, make-parity wall time, bisection cost")
    p.add_argument("--json", default="reports/bench.json", help="where to write every figure")
    p.add_argument("--skip", default="", help="comma-separated: " + ",".join(STEPS))
    p.add_argument("--iters", type=count, default=30)
    p.add_argument("--faults", default="", metavar="NAME,...",
                   help="bisection: these faults of the catalog only (default: every fault)")
    p.add_argument("--seeds", type=count, default=1, help="false alarms: seeds per shipped scenario (default 1)")
    p.add_argument("--alarm-requests", type=count, default=3, help="false alarms: requests per scenario (default 3)")
    p.add_argument("--alarm-tokens", type=count, default=12, help="false alarms: tokens per request (default 12)")
    p.add_argument("--numerics-scale", type=non_negative, default=None,
                   help="false alarms: the simulated padding numerics (see --simulate-padding-numerics; default 0.1, "
                        "but 0 for --alarm-shape on CUDA, whose bf16 kernels have padding numerics of their own)")
    p.add_argument("--alarm-shape", default=None, choices=sorted(SHAPES),
                   help="false alarms: on a synthetic pair of this shape in bf16 (built in a temporary folder), "
                        "not the embedded tiny pair: `tiny` on a CPU, `llama3-1b` on a GPU")
    suites = p.add_subparsers(dest="suite", parser_class=Parser)
    register_scale(suites)
    fa = suites.add_parser("false-alarms", help="the gate's false-alarm rate on the clean engine over many seeds")
    fa.add_argument("--scenario", default="scenarios/default.yaml")
    fa.add_argument("--seeds", type=count, default=50)
    fa.add_argument("--requests", type=count, default=2)
    fa.add_argument("--max-tokens", type=count, default=12)
    fa.add_argument("--temperature", type=non_negative, default=0.8)
    fa.add_argument("--mode", default="full")
    fa.add_argument("--backend", default="emulated", choices=["auto", "cuda", "emulated"])
    p.set_defaults(handler=runs("bench"))


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
