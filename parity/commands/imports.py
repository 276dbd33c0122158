"""`parity import FILE`: read acceptance from vLLM (metrics text or printed example output)."""

from __future__ import annotations

import json

from parity.commands.common import console
from parity.commands.options import EXIT_PASS
from parity.importers.vllm import load_vllm
from parity.report.imported import render_record


def main(args) -> int:
    """Print the acceptance read from a vLLM file (exit 2 on a bad one)."""
    record = load_vllm(args.file, args.num_drafts, args.format)
    if args.json:
        print(json.dumps(record.as_dict(), indent=2))
    else:
        render_record(record.as_dict(), console=console())
    return EXIT_PASS
