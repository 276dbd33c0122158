"""`parity gate`'s arguments. Light (no torch): its `--help` and a bad flag answer at once;
the command itself, gate.py, is imported only when it runs."""

from __future__ import annotations

from parity.commands.options import add_common, add_force, runs


def register(sub) -> None:
    gate = sub.add_parser("gate", help="CI gate: fail on acceptance or parity drift (JUnit, Markdown, baselines)")
    add_common(gate)
    add_force(gate)
    gate.set_defaults(scenario=None)   # engine runs: scenarios/default.yaml; imports: default tolerances
    gate.add_argument("--baseline", default=None, metavar="FILE", help="compare every mode with this baseline")
    gate.add_argument("--update-baseline", action="store_true",
                      help="write the run's counts to --baseline (default scenarios/baselines/<scenario>.json)")
    gate.add_argument("--junit", default=None, metavar="FILE", help="write JUnit XML here")
    gate.add_argument("--markdown", default=None, metavar="FILE", help="write a Markdown summary here")
    gate.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE",
                      help="a vLLM metrics or printed-acceptance file (repeat; the first is the reference)")
    gate.add_argument("--num-drafts", type=int, default=None, metavar="N",
                      help="drafts behind rates-only imports (vLLM's printed text), for a statistical test")
    gate.set_defaults(handler=runs("gate"))
