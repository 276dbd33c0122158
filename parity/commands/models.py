"""`parity models list|build`: the model zoo and what this machine has; retrain an embedded pair."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from parity.commands.common import EXIT_PASS, Parser
from parity.models.assets import write_manifest
from parity.models.zoo import ASSETS, ZOO, availability


def register(sub) -> None:
    models = sub.add_parser("models", help="list or build models")
    models_sub = models.add_subparsers(dest="models_command", required=True, parser_class=Parser)
    models_sub.add_parser("list", help="the model zoo and what is available here")
    build = models_sub.add_parser("build", help="train an embedded tiny pair into parity/assets/")
    build.add_argument("--pair", default="tiny-llama3-eagle", choices=["tiny-llama3-eagle", "tiny-llama3-eagle3"],
                       help="which embedded pair (tiny-llama3-eagle3 reuses tiny-llama3-eagle's target)")
    build.add_argument("--out", default=None, help="folder (default parity/assets/<pair>)")
    models.set_defaults(handler=main)


def main(args) -> int:
    """List the zoo, or build an embedded pair."""
    if args.models_command == "list":
        return list_models()
    return build(args)


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
        from parity.training.build_eagle3 import build_tiny_eagle3_pair as build_pair
    else:
        from parity.training.build import build_tiny_pair as build_pair
    out = Path(args.out) if args.out else ASSETS / args.pair
    info = build_pair(out, progress=lambda line: print(line, flush=True))
    if args.out is None:
        write_manifest(ASSETS)
    print(json.dumps(info.get("acceptance", {}), default=str))
    print(f"built {out}")
    return EXIT_PASS
