"""`parity faults list|matrix`'s arguments. Light (no torch): its `--help` and a bad flag answer at once;
the command itself, faults.py, is imported only when it runs."""

from __future__ import annotations

from parity.commands.options import Parser, non_negative, runs


def register(sub) -> None:
    faults = sub.add_parser("faults", help="the catalog of injectable bugs")
    faults_sub = faults.add_subparsers(dest="faults_command", required=True, parser_class=Parser)
    faults_sub.add_parser("list", help="every fault with its kind, site and source report")
    matrix = faults_sub.add_parser("matrix", help="inject every fault, run every mode, print the diagnoses")
    matrix.add_argument("--model", default="tiny-llama3-eagle")
    matrix.add_argument("--backend", default="auto", choices=["auto", "cuda", "emulated"])
    matrix.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="weights dtype of every run (as `parity run --dtype`)")
    matrix.add_argument("--simulate-padding-numerics", type=non_negative, default=0.0, metavar="SCALE",
                        help="run every fault under the padding-numerics test seam (as `parity run`)")
    matrix.add_argument("--markdown", action="store_true", help="print a Markdown table")
    faults.set_defaults(handler=runs("faults"))
