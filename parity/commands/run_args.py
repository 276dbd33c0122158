"""`parity run`'s arguments, the memory plan's and tensor parallelism's included. Light (no torch): its
`--help` and a bad flag answer at once; the command itself, run.py, is imported only when it runs."""

from __future__ import annotations

from parity.commands.options import add_common, add_force, count, gibibytes, positive, runs


def register(sub) -> None:
    run = sub.add_parser("run", help="run a scenario in every mode and compare with eager")
    add_common(run)
    add_force(run)
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument("--no-bisect", action="store_true", help="do not diagnose drifting modes")
    run.add_argument("--check-unpadded", action="store_true",
                     help="also run eager one request at a time (no batching, no padding) and say whether eager "
                          "itself agrees with it: a bug every mode shares is the engine's, not the graphs'")
    run.add_argument("--jobs", type=count, default=None, metavar="N",
                     help="runs at once, in worker processes sharing the weights (1: one after another; default: "
                          "concurrent on CUDA as far as the memory plan fits, sequential on the CPU)")
    run.add_argument("--no-mps", action="store_true",
                     help="concurrent runs on CUDA without a private MPS daemon (default: one is started when "
                          "nvidia-cuda-mps-control is on the PATH and no MPS daemon runs, so the runs' kernels share "
                          "the GPU instead of time-slicing it; docs/memory.md)")
    add_memory_options(run)
    add_tp_options(run)
    run.set_defaults(handler=runs("run"))


def add_memory_options(p) -> None:
    p.add_argument("--plan", action="store_true",
                   help="print the memory plan (component x mode) and exit, loading no weight: 0 when it fits, "
                        "2 when it does not")
    p.add_argument("--verbose", action="store_true",
                   help="one line per run: capture and run seconds, peak and leftover device memory")
    p.add_argument("--device-memory", type=gibibytes, default=None, metavar="GIB",
                   help="plan against a device with this much free memory instead of measuring it")


def add_tp_options(p) -> None:
    p.add_argument("--tp", type=count, default=1, metavar="N",
                   help="tensor-parallel ranks (the target sharded over N processes; docs/tp.md)")
    p.add_argument("--tp-timeout", type=positive, default=None, metavar="SECONDS",
                   help="how long a collective or a descriptor exchange may wait for a peer rank (default 120; "
                        "needs --tp 2 or more)")
    p.add_argument("--tp-all-reduce", choices=("collective", "registered"), default=None,
                   help="the row-parallel all-reduce: the backend's collective (NCCL, gloo), or a custom all-reduce "
                        "through registered buffers every rank maps (docs/tp.md); needs --tp 2 or more")
