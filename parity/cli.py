"""The `parity` command line. Thin: assembles one module per command; exits 0 / 1 (drift) / 2 (bad input)."""

from __future__ import annotations

import sys

from parity.commands import bench, bisect, faults, gate, imports, models, report, run, scenarios
from parity.commands.common import EXIT_USAGE, Parser
from parity.errors import ParityInputError

COMMANDS = (run, bisect, faults, report, gate, imports, models, scenarios, bench)


def build_parser() -> Parser:
    """The argument parser of every `parity` command."""
    parser = Parser(prog="parity", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse, dispatch, and turn bad input into one line and exit 2."""
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except ParityInputError as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("parity: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
