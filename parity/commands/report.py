"""`parity report DIR`: re-render a saved run from its summary.json (no model needed).

summary.json may come from anywhere: another version, a truncated upload, a
hand edit, a staging folder a killed run left behind. The folder and the file
are checked first (a staging folder is refused, its run never finished), then
the fields every renderer relies on, then the rendering itself is tried on a
throwaway console, so a summary this version cannot render is one line and
exit 2, never a KeyError traceback half way through a table.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.errors import ConsoleError

from parity.analysis.summary import SCHEMA_VERSION

# Schema 1 runs (before the padded-reference verdict) still render: their modes lack `reference`.
READABLE_SCHEMAS = (1, SCHEMA_VERSION)
from parity.commands.common import console
from parity.commands.options import EXIT_DRIFT, EXIT_PASS
from parity.engine.config import MAX_K
from parity.errors import ParityInputError
from parity.files import is_file, read_text_file
from parity.report.artifacts import is_staging
from parity.report.console import render
from parity.report.diagnosis import diagnoses_view
from parity.report.markdown import render_markdown

# What a broken summary makes a renderer raise; anything else is a bug and reaches the boundary.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, ZeroDivisionError,
              ConsoleError)


def main(args) -> int:
    """Re-render a saved run from its summary.json."""
    summary = load_summary(Path(args.dir))
    if args.markdown:
        sys.stdout.write(render_markdown(summary))
    else:
        render(summary, console=console(), diagnosis_panel=diagnoses_view(summary))
    return EXIT_PASS if summary.get("verdict") == "pass" else EXIT_DRIFT


def load_summary(folder: Path) -> dict:
    """The summary of a finished run folder, checked to render; every problem is one ParityInputError line."""
    if is_staging(os.path.abspath(folder)):
        raise ParityInputError(f"{folder}: an unfinished run folder (a run was killed while writing it); "
                               f"nothing to report")
    path = folder / "summary.json"
    if not is_file(path):
        raise ParityInputError(f"{path}: not found (give a run folder written by `parity run`)")
    try:
        summary = json.loads(read_text_file(path, "run summary (JSON)"))
    except json.JSONDecodeError as exc:
        raise ParityInputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise ParityInputError(f"{path}: not a parity summary (nested too deeply)") from None
    check_summary(summary, path)
    try:
        render(summary, console=Console(file=io.StringIO(), width=100), diagnosis_panel=diagnoses_view(summary))
        render_markdown(summary)
    except _MALFORMED as exc:
        raise ParityInputError(f"{path}: a summary this version cannot render ({exc.__class__.__name__}: "
                               f"{str(exc)[:80]}); was it written by another version?") from None
    return summary


# Every verdict a summary can hold (analysis/summary.py); a summary saying anything else renders no banner.
VERDICTS = ("pass", "drift", "not_exercised")


def check_summary(summary, path: Path) -> None:
    """The fields every renderer relies on: schema version, K, and per mode K acceptance figures."""
    if not isinstance(summary, dict) or not isinstance(summary.get("modes"), dict) or not summary["modes"]:
        raise ParityInputError(f"{path}: not a parity summary (no 'modes')")
    if summary.get("schema_version") not in READABLE_SCHEMAS:
        raise ParityInputError(f"{path}: summary schema {repr(summary.get('schema_version'))[:20]}, this version "
                               f"reads {', '.join(map(str, READABLE_SCHEMAS))}")
    if summary.get("verdict") not in VERDICTS:
        raise ParityInputError(f"{path}: 'verdict' must be one of {', '.join(VERDICTS)}, "
                               f"got {repr(summary.get('verdict'))[:40]}")
    k = summary.get("k")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise ParityInputError(f"{path}: 'k' must be an integer in 1..{MAX_K}, got {str(k)[:20]}")
    for mode, m in summary["modes"].items():
        rates = m.get("acceptance_per_position") if isinstance(m, dict) else None
        # null: no draft had a node at that position (a tree's depth it never reached)
        numbers = isinstance(rates, list) and all(r is None or isinstance(r, (int, float)) and not isinstance(r, bool)
                                                  for r in rates)
        if not isinstance(m, dict) or m.get("verdict") not in VERDICTS:
            raise ParityInputError(f"{path}: mode {mode[:40]!r}: 'verdict' must be one of {', '.join(VERDICTS)}, "
                                   f"got {repr(m.get('verdict') if isinstance(m, dict) else m)[:40]}")
        if not numbers or len(rates) != k or not isinstance(m.get("num_drafts"), int):
            raise ParityInputError(f"{path}: mode {mode[:40]!r} needs num_drafts and {k} acceptance rates")
