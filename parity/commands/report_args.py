"""`parity report DIR`'s arguments. Light (no torch): its `--help` and a bad flag answer at once;
the command itself, report.py, is imported only when it runs."""

from __future__ import annotations

from parity.commands.options import runs


def register(sub) -> None:
    report = sub.add_parser("report", help="re-render a saved run (no model needed)")
    report.add_argument("dir", help="a run folder holding summary.json")
    report.add_argument("--markdown", action="store_true", help="print report.md's Markdown instead")
    report.set_defaults(handler=runs("report"))
