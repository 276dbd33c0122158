"""`parity models list|build`: the model zoo and what this machine has; retrain an embedded pair."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from parity.commands.options import EXIT_PASS
from parity.errors import ParityInputError
from parity.models.assets import write_manifest
from parity.builders.synth.at_load import DEFAULT_SCALE, write_recipe
from parity.builders.synth.build import check_out, synthesize
from parity.builders.synth.spec import TARGET_FOLDER, SynthRequest
from parity.models.zoo import ASSETS, ZOO, availability


def main(args) -> int:
    """List the zoo, build an embedded pair, or write a synthetic one."""
    if args.models_command == "list":
        return list_models()
    if args.models_command == "synth":
        return synth(args)
    return build(args)


def synth(args) -> int:
    """Write a random-weights target + EAGLE head calibrated to --acceptance into --out (exit 2 on bad input)."""
    if args.at_load and args.peak is not None:
        raise ParityInputError("--peak calibrates weights, and --at-load pairs are drawn at load, uncalibrated: "
                               "drop --peak, or drop --at-load")
    if args.scale is not None and not args.at_load:
        raise ParityInputError("--scale is the at-load recipe's; a synthesised pair calibrates its own scale: "
                               "drop --scale, or add --at-load")
    request = SynthRequest(args.shape, args.head, args.acceptance, args.dtype, args.out, args.seed, args.device,
                           args.mtp_layers, args.hybrid_every, args.peak)
    if args.at_load:
        check_out(Path(args.out))
        write_recipe(Path(args.out), args.shape, args.head, args.seed, args.scale or DEFAULT_SCALE,
                     request.torch_dtype)
        print(f"wrote the recipe of {args.shape} + {args.head} in {args.out} (weights drawn at load); run it with:\n"
              f"  parity run --tp N --model local --target-path {Path(args.out) / TARGET_FOLDER} "
              f"--draft-path {Path(args.out) / args.head} --dtype {args.dtype}")
        return EXIT_PASS
    synthesize(request, progress=lambda line: print(line, flush=True))
    out = Path(args.out)
    print(f"built {out}; run parity on it with:\n  parity run --model local --target-path {out / TARGET_FOLDER} "
          f"--draft-path {out / args.head}")
    return EXIT_PASS


def list_models() -> int:
    table = Table(title="models", title_justify="left")
    table.add_column("name", no_wrap=True)   # names are what users type: never cut them
    for col in ("head", "status", "target", "draft"):
        table.add_column(col, overflow="fold")
    for name, entry in ZOO.items():
        table.add_row(name, entry.head, availability(name), entry.target_repo, entry.draft_repo)
    Console().print(table)
    return EXIT_PASS


def build(args) -> int:
    """Train an embedded tiny pair (deterministic; minutes on 2 cores)."""
    # NOTE: imported here: training pulls in the corpus builder and optimiser code
    # that no other command needs.
    if args.pair == "tiny-llama3-eagle3":
        from parity.builders.training.build_eagle3 import build_tiny_eagle3_pair as build_pair
    else:
        from parity.builders.training.build import build_tiny_pair as build_pair
    out = Path(args.out) if args.out else ASSETS / args.pair
    info = build_pair(out, progress=lambda line: print(line, flush=True))
    if args.out is None:
        write_manifest(ASSETS)
    print(json.dumps(info.get("acceptance", {}), default=str))
    print(f"built {out}")
    return EXIT_PASS
