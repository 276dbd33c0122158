"""`parity import FILE`: read acceptance from vLLM (metrics text or printed example output)."""

from __future__ import annotations

import json

from parity.commands.common import console
from parity.commands.options import EXIT_PASS
from parity.importers.vllm import load_vllm
from parity.report.imported import render_record


def register(sub) -> None:
    imp = sub.add_parser("import", help="read acceptance from vLLM (metrics text or printed example output)")
    imp.add_argument("file", help="Prometheus text of /metrics, or the text vLLM's eagle example printed")
    imp.add_argument("--num-drafts", type=int, default=None, metavar="N", help="drafts behind printed rates")
    imp.add_argument("--format", default="auto", choices=["auto", "prometheus", "text"])
    imp.add_argument("--json", action="store_true", help="print the acceptance record as JSON")
    imp.set_defaults(handler=main)


def main(args) -> int:
    """Print the acceptance read from a vLLM file (exit 2 on a bad one)."""
    record = load_vllm(args.file, args.num_drafts, args.format)
    if args.json:
        print(json.dumps(record.as_dict(), indent=2))
    else:
        render_record(record.as_dict(), console=console())
    return EXIT_PASS
