"""What every command's arguments share: exit codes, the parser class, the option types, the common options.

The parser is built before any command runs, for `parity --help` and for a bad
flag (one line, exit 2) too, so this module and every `<command>_args.py` stay
light: the standard library and the zoo's names, no torch, no transformers.
"""

from __future__ import annotations

import argparse
import importlib
import math

from parity.errors import ParityInputError
from parity.models.zoo import DEFAULT_SCENARIO

EXIT_PASS, EXIT_DRIFT, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143      # 128 + SIGINT, 128 + SIGTERM, as a shell reports them


def runs(command: str):
    """The handler of `parity COMMAND`: commands/COMMAND.py's `main`, imported only when the command runs (its
    imports, torch with them, take seconds; the parser is built without them)."""
    def handler(args) -> int:
        return importlib.import_module(f"parity.commands.{command}").main(args)
    return handler


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        raise ParityInputError(f"{self.prog}: {message}")


# Numeric options, checked as they are parsed (one line, exit 2), before anything runs: a NaN or an
# infinity compares False with every bound, so each type says what it accepts rather than what it refuses.
MAX_OPTION_COUNT = 1 << 20


def count(text: str) -> int:
    """An integer in 1..2**20 (iterations, seeds, requests, tokens)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_OPTION_COUNT:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_OPTION_COUNT}, got {value}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """A finite number >= 0 (a scale, a temperature)."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def positive(text: str) -> float:
    """A finite number > 0 (a size in GiB, seconds)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def gibibytes(text: str) -> float:
    """A memory size in GiB: > 0 and at most 2**20 (a pebibyte: past any device)."""
    value = positive(text)
    if value > MAX_OPTION_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_OPTION_COUNT} GiB, got {text!r}")
    return value


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama3-eagle", help="zoo name (see `parity models list`)")
    p.add_argument("--scenario", default=None, help="scenario YAML file (default: the model's own: "
                                                     "scenarios/llama3-eagle.yaml for llama3-eagle and "
                                                     f"llama3.1-eagle3, else {DEFAULT_SCENARIO})")
    p.add_argument("--modes", default="all", help="comma-separated modes, or 'all' (eager always runs)")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "emulated"],
                   help="graph backend: cuda graphs, the CPU emulation, or cuda when available")
    p.add_argument("--inject", action="append", default=[], metavar="FAULT",
                   help="inject a catalogued fault (repeatable; see `parity faults list`)")
    p.add_argument("--out", default=None, help="artifact folder (default reports/<run-id>/)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--target-path", default=None, help="local folder of the target checkpoint")
    p.add_argument("--draft-path", default=None, help="local folder of the draft head checkpoint")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights dtype (auto: float32 for embedded pairs, bfloat16 for real ones on GPU)")
    p.add_argument("--simulate-padding-numerics", type=non_negative, default=0.0, metavar="SCALE",
                   help="test seam: padded forwards (graphs and their references, never eager) move their logits "
                        "by SCALE x a fixed function of the padded shape, as bf16 kernels on a GPU do "
                        "(docs/verdicts.md)")


def add_force(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="replace the run already in --out (run folders only)")
