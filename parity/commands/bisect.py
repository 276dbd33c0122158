"""`parity bisect`: localise and explain a graph mode's drift."""

from __future__ import annotations

import json

from rich.console import Console

from parity.commands.common import run_request
from parity.commands.options import EXIT_DRIFT, EXIT_PASS
from parity.diagnosis.kinds import NONE
from parity.diagnosis.panel import diagnosis_panel
from parity.harness.session import bisect_session


def main(args) -> int:
    """Localise and explain a graph mode's drift; exit 0 when nothing drifts, 1 with a diagnosis."""
    diagnosis = bisect_session(run_request(args), args.mode)
    if args.json:
        print(json.dumps(diagnosis, indent=2, default=str))
    else:
        Console().print(diagnosis_panel(diagnosis))
    return EXIT_PASS if diagnosis["kind"] == NONE else EXIT_DRIFT
