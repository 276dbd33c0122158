"""`parity import FILE`'s arguments. Light (no torch): its `--help` and a bad flag answer at once;
the command itself, imports.py, is imported only when it runs."""

from __future__ import annotations

from parity.commands.options import runs


def register(sub) -> None:
    imp = sub.add_parser("import", help="read acceptance from vLLM (metrics text or printed example output)")
    imp.add_argument("file", help="Prometheus text of /metrics, or the text vLLM's eagle example printed")
    imp.add_argument("--num-drafts", type=int, default=None, metavar="N", help="drafts behind printed rates")
    imp.add_argument("--format", default="auto", choices=["auto", "prometheus", "text"])
    imp.add_argument("--json", action="store_true", help="print the acceptance record as JSON")
    imp.set_defaults(handler=runs("imports"))
