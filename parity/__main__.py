"""`python -m parity` and the `parity` script: signals that arrive while starting are one line too.

Importing torch and transformers takes seconds; a SIGINT or SIGTERM in that
time would otherwise print an import traceback (SIGINT) or end the process with
no word (SIGTERM). Nothing is written before the command runs, so the process
just says so and exits 128 + the signal; once the command runs, the error
boundary (commands/boundary.py) handles signals as it handles everything else.
"""

import os
import signal
import sys

_WHILE_STARTING = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}


def _starting(signum, frame):
    code, word = _WHILE_STARTING[signum]
    os.write(2, f"parity: {word} while starting (nothing was written)\n".encode())
    os._exit(code)


def main() -> int:
    previous = {signum: signal.signal(signum, _starting) for signum in _WHILE_STARTING}
    from parity.harness import warm          # light: no torch, no transformers

    warm.start(warm.expected(sys.argv[1:]))  # workers a concurrent run will want import while this process does
    from parity.cli import main as run_cli   # torch, transformers: seconds of imports

    for signum, handler in previous.items():
        signal.signal(signum, handler)
    return run_cli()


if __name__ == "__main__":
    sys.exit(main())
