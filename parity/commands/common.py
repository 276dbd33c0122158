"""What the commands share once they run: requests from arguments, the console, the at-load pairs' generator
(what their arguments share, exit codes included, is options.py)."""

from __future__ import annotations

import os

from rich.console import Console

from parity.builders.synth.at_load import generate_pair
from parity.errors import ParityInputError
from parity.faults.catalog import resolve_faults
from parity.faults.seam import apply
from parity.harness.request import RunRequest
from parity.harness.simulated_numerics import simulate_padding_numerics
from parity.models import pair
from parity.models.zoo import check_model_paths, scenario_of

# `parity models synth --at-load` pairs are drawn at load (each rank its slices): the generator is a builder,
# which only commands may import, so the command layer hands it to the loader: here, in the module every
# command that loads a pair imports (run and its ranks, bisect, gate, bench, bench scale).
pair.register_generator(generate_pair)


def requested_modes(text: str | None) -> tuple[str, ...] | None:
    """None for every mode ('all'); else the named modes. An empty list names none: it is refused, not read
    as 'all'."""
    if text is None or text.strip() == "all":
        return None
    modes = tuple(m.strip() for m in text.split(","))
    if not all(modes):
        raise ParityInputError(f"--modes {text!r}: an empty mode name; give comma-separated modes or 'all'")
    return modes


def engine_parts(args) -> dict:
    """The engine parts and capture policy: every `--inject`ed fault applied, and the numerics seam if asked."""
    resolve_faults(args.inject)
    parts, policy = apply(list(dict.fromkeys(args.inject)))
    return {"parts": simulate_padding_numerics(parts, args.simulate_padding_numerics), "policy": policy}


def run_request(args) -> RunRequest:
    """The harness request of `parity run` / `parity bisect` arguments."""
    check_model_paths(args.model, args.target_path, args.draft_path)
    return RunRequest(args.model, scenario_of(args.model, args.scenario), requested_modes(args.modes), args.backend,
                      **engine_parts(args),
                      seed=args.seed, target_path=args.target_path, draft_path=args.draft_path, dtype=args.dtype,
                      bisect=not getattr(args, "no_bisect", False),
                      check_unpadded=getattr(args, "check_unpadded", False))


def console() -> Console:
    """A rich Console; NO_COLOR set means no escape sequences at all (rich alone keeps bold and dim)."""
    return Console(color_system=None) if os.environ.get("NO_COLOR") else Console()
