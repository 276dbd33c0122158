"""The steps of `parity bench`, in the order bench.py runs them; its --skip names them (bench_args.py).

Apart from both: the arguments must not import the benchmarks (torch), and the
benchmarks must not import the arguments, which import them as the command runs.
"""

STEPS = ("latency", "parity", "bisect", "audit", "alarms", "analysis")
