"""`python -m parity` and the `parity` script: signals that arrive while starting are one line too.

A SIGINT or SIGTERM while the command line is imported would otherwise print
an import traceback (SIGINT) or end the process with no word (SIGTERM).
Nothing is written before the command runs, so the process just says so and
exits 128 + the signal; once the command runs, the error boundary
(commands/boundary.py) handles signals as it handles everything else, the
seconds of torch and transformers a command imports as it starts included.
"""

import os
import signal
import sys

_WHILE_STARTING = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}


def _starting(signum, frame):
    code, word = _WHILE_STARTING[signum]
    os.write(2, f"parity: {word} while starting (nothing was written)\n".encode())
    stop = getattr(sys.modules.get("parity.harness.mps"), "stop", None)   # None: not imported (or not yet whole)
    if stop is not None:
        stop()                          # a private MPS daemon started already: told to quit
    os._exit(code)


def main() -> int:
    previous = {signum: signal.signal(signum, _starting) for signum in _WHILE_STARTING}
    from parity.harness import mps, warm     # light: no torch, no transformers

    width = warm.expected(sys.argv[1:])
    if width > 1 or warm.bench_run(sys.argv[1:]):
        mps.start(sys.argv[1:])              # before any CUDA context here or in a worker: all are its clients
    warm.start(width)                        # workers a concurrent run will want import while this process does
    from parity.cli import main as run_cli   # light: a command imports torch and transformers as it runs

    for signum, handler in previous.items():
        signal.signal(signum, handler)
    return run_cli()


if __name__ == "__main__":
    sys.exit(main())
