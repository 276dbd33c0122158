"""`parity bisect`'s arguments. Light (no torch): its `--help` and a bad flag answer at once;
the command itself, bisect.py, is imported only when it runs."""

from __future__ import annotations

from parity.commands.options import add_common, runs


def register(sub) -> None:
    bisect = sub.add_parser("bisect", help="diagnose why a graph mode drifts from eager")
    add_common(bisect)
    bisect.add_argument("--mode", default=None,
                        help="the graph mode to bisect (default: the first scenario mode that drifts)")
    bisect.add_argument("--json", action="store_true", help="print the diagnosis object alone on stdout")
    bisect.set_defaults(handler=runs("bisect"))
