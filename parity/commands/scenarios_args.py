"""`parity scenarios list`'s arguments. Light (no torch): its `--help` and a bad flag answer at once;
the command itself, scenarios.py, is imported only when it runs."""

from __future__ import annotations

from parity.commands.options import Parser, runs


def register(sub) -> None:
    scenarios = sub.add_parser("scenarios", help="list shipped scenarios")
    scenarios_sub = scenarios.add_subparsers(dest="scenarios_command", required=True, parser_class=Parser)
    ls = scenarios_sub.add_parser("list", help="scenario files and what they reproduce")
    ls.add_argument("--dir", default="scenarios")
    scenarios.set_defaults(handler=runs("scenarios"))
