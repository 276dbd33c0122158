"""`parity report DIR`: re-render a saved run from its summary.json (no model needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from parity.commands.common import EXIT_DRIFT, EXIT_PASS, console
from parity.errors import ParityInputError
from parity.report.console import render
from parity.report.diagnosis import diagnoses_view
from parity.report.markdown import render_markdown


def register(sub) -> None:
    report = sub.add_parser("report", help="re-render a saved run (no model needed)")
    report.add_argument("dir", help="a run folder holding summary.json")
    report.add_argument("--markdown", action="store_true", help="print report.md's Markdown instead")
    report.set_defaults(handler=main)


def main(args) -> int:
    """Re-render a saved run from its summary.json."""
    path = Path(args.dir) / "summary.json"
    if not path.is_file():
        raise ParityInputError(f"{path}: not found (give a run folder written by `parity run`)")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ParityInputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(summary, dict) or "modes" not in summary:
        raise ParityInputError(f"{path}: not a parity summary (no 'modes')")
    if args.markdown:
        sys.stdout.write(render_markdown(summary))
    else:
        render(summary, console=console(), diagnosis_panel=diagnoses_view(summary))
    return EXIT_DRIFT if summary.get("verdict") == "drift" else EXIT_PASS
