"""The `parity` command line. Thin: parses, calls, renders, exits 0 / 1 (drift) / 2 (bad input)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from parity.errors import ParityInputError

EXIT_PASS, EXIT_DRIFT, EXIT_USAGE = 0, 1, 2
DEFAULT_SCENARIO = "scenarios/default.yaml"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        raise ParityInputError(f"{self.prog}: {message}")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama3-eagle", help="zoo name (see `parity models list`)")
    p.add_argument("--scenario", default=DEFAULT_SCENARIO, help="scenario YAML file")
    p.add_argument("--modes", default="all", help="comma-separated modes, or 'all' (eager always runs)")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "emulated"],
                   help="graph backend: cuda graphs, the CPU emulation, or cuda when available")
    p.add_argument("--inject", action="append", default=[], metavar="FAULT",
                   help="inject a catalogued fault (repeatable; see `parity faults list`)")
    p.add_argument("--out", default=None, help="artifact folder (default reports/<run-id>/)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--target-path", default=None, help="local folder of the target checkpoint")
    p.add_argument("--draft-path", default=None, help="local folder of the draft head checkpoint")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights dtype (auto: float32 for embedded pairs, bfloat16 for real ones on GPU)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every `parity` command."""
    parser = _Parser(prog="parity", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a scenario in every mode and compare with eager")
    _common(run)
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument("--no-bisect", action="store_true", help="do not diagnose drifting modes")

    bisect = sub.add_parser("bisect", help="diagnose why a graph mode drifts from eager")
    _common(bisect)
    bisect.add_argument("--mode", default=None,
                        help="the graph mode to bisect (default: the first scenario mode that drifts)")
    bisect.add_argument("--json", action="store_true", help="print the diagnosis object alone on stdout")

    faults = sub.add_parser("faults", help="the catalog of injectable bugs")
    faults_sub = faults.add_subparsers(dest="faults_command", required=True, parser_class=_Parser)
    faults_sub.add_parser("list", help="every fault with its kind, site and source report")
    matrix = faults_sub.add_parser("matrix", help="inject every fault, run every mode, print the diagnoses")
    matrix.add_argument("--model", default="tiny-llama3-eagle")
    matrix.add_argument("--backend", default="auto", choices=["auto", "cuda", "emulated"])
    matrix.add_argument("--markdown", action="store_true", help="print a Markdown table")

    report = sub.add_parser("report", help="re-render a saved run (no model needed)")
    report.add_argument("dir", help="a run folder holding summary.json")
    report.add_argument("--markdown", action="store_true", help="print report.md's Markdown instead")

    gate = sub.add_parser("gate", help="CI gate: fail on acceptance or parity drift (JUnit, Markdown, baselines)")
    _common(gate)
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

    imp = sub.add_parser("import", help="read acceptance from vLLM (metrics text or printed example output)")
    imp.add_argument("file", help="Prometheus text of /metrics, or the text vLLM's eagle example printed")
    imp.add_argument("--num-drafts", type=int, default=None, metavar="N", help="drafts behind printed rates")
    imp.add_argument("--format", default="auto", choices=["auto", "prometheus", "text"])
    imp.add_argument("--json", action="store_true", help="print the acceptance record as JSON")

    models = sub.add_parser("models", help="list or build models")
    models_sub = models.add_subparsers(dest="models_command", required=True, parser_class=_Parser)
    models_sub.add_parser("list", help="the model zoo and what is available here")
    build = models_sub.add_parser("build", help="train an embedded tiny pair into parity/assets/")
    build.add_argument("--pair", default="tiny-llama3-eagle", choices=["tiny-llama3-eagle", "tiny-llama3-eagle3"],
                       help="which embedded pair (tiny-llama3-eagle3 reuses tiny-llama3-eagle's target)")
    build.add_argument("--out", default=None, help="folder (default parity/assets/<pair>)")

    scenarios = sub.add_parser("scenarios", help="list shipped scenarios")
    scenarios_sub = scenarios.add_subparsers(dest="scenarios_command", required=True, parser_class=_Parser)
    ls = scenarios_sub.add_parser("list", help="scenario files and what they reproduce")
    ls.add_argument("--dir", default="scenarios")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse, dispatch, and turn bad input into one line and exit 2."""
    try:
        args = build_parser().parse_args(argv)
        return _dispatch(args)
    except ParityInputError as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("parity: interrupted", file=sys.stderr)
        return 130


def _dispatch(args) -> int:
    if args.command == "run":
        return cmd_run(args)
    if args.command == "report":
        return cmd_report(args)
    if args.command == "gate":
        return cmd_gate(args)
    if args.command == "import":
        return cmd_import(args)
    if args.command == "models":
        return cmd_models(args)
    if args.command == "bisect":
        return cmd_bisect(args)
    if args.command == "faults":
        return cmd_faults(args)
    if args.command == "scenarios":
        return cmd_scenarios(args)
    raise ParityInputError(f"unknown command {args.command}")


def cmd_run(args) -> int:
    """Run the scenario in each mode, compare with eager, render and save the report."""
    from parity.session import RunRequest, run_session
    from parity.report.console import render

    from parity.report.diagnosis import diagnoses_view

    request = RunRequest.from_args(args)
    outcome = run_session(request, show_progress=not args.quiet)
    render(outcome.summary, diagnosis_panel=diagnoses_view(outcome.summary))
    print(f"artifacts: {outcome.out_dir}")
    return EXIT_DRIFT if outcome.summary["verdict"] == "drift" else EXIT_PASS


def cmd_bisect(args) -> int:
    """Localise and explain a graph mode's drift; exit 0 when nothing drifts, 1 with a diagnosis."""
    from rich.console import Console

    from parity.report.diagnosis import diagnosis_panel
    from parity.session import RunRequest, bisect_session

    request = RunRequest.from_args(args)
    diagnosis = bisect_session(request, args.mode)
    if args.json:
        print(json.dumps(diagnosis, indent=2, default=str))
    else:
        Console().print(diagnosis_panel(diagnosis))
    return EXIT_PASS if diagnosis["kind"] == "NONE" else EXIT_DRIFT


def cmd_faults(args) -> int:
    """Print the fault catalog."""
    from rich.console import Console

    from parity.faults.catalog import FAULTS
    from parity.report.catalog import fault_catalog

    if args.faults_command == "matrix":
        return cmd_faults_matrix(args)
    Console().print(fault_catalog(FAULTS.values()))
    return EXIT_PASS


def cmd_faults_matrix(args) -> int:
    """Inject each fault on its home scenario, run every mode, and tabulate what was found."""
    from rich.console import Console
    from rich.table import Table

    from parity.faults.matrix import matrix_rows, run_matrix
    from parity.graphs.modes import MODES
    from parity.session import resolve_backend

    backend, _ = resolve_backend(args.backend)
    rows = matrix_rows(run_matrix(args.model, backend, progress=lambda n: print(f"  {n} done", file=sys.stderr)))
    if args.markdown:
        print("| fault | " + " | ".join(MODES) + " |")
        print("|---" * (len(MODES) + 1) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return EXIT_PASS
    table = Table(title=f"fault x mode ({args.model}, {backend}); '-' = not flagged", title_justify="left")
    for col in ("fault", *MODES):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)
    return EXIT_PASS


def cmd_report(args) -> int:
    """Re-render a saved run from its summary.json."""
    from parity.report.console import render

    path = Path(args.dir) / "summary.json"
    if not path.is_file():
        raise ParityInputError(f"{path}: not found (give a run folder written by `parity run`)")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ParityInputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(summary, dict) or "modes" not in summary:
        raise ParityInputError(f"{path}: not a parity summary (no 'modes')")
    from parity.report.diagnosis import diagnoses_view

    if args.markdown:
        from parity.report.markdown import render_markdown

        sys.stdout.write(render_markdown(summary))
    else:
        render(summary, console=_console(), diagnosis_panel=diagnoses_view(summary))
    return EXIT_DRIFT if summary.get("verdict") == "drift" else EXIT_PASS


def _console():
    """A rich Console; NO_COLOR set means no escape sequences at all (rich alone keeps bold and dim)."""
    import os

    from rich.console import Console

    return Console(color_system=None) if os.environ.get("NO_COLOR") else Console()


def cmd_gate(args) -> int:
    """Run (or import) every mode, compare with eager and the baseline; exit 0 pass, 1 drift, 2 bad input."""
    from parity.gate_session import GateRequest, run_gate
    from parity.report.gate import render_gate

    outcome = run_gate(GateRequest.from_args(args), show_progress=sys.stderr.isatty())
    render_gate(outcome.report, console=_console())
    return EXIT_DRIFT if outcome.verdict == "drift" else EXIT_PASS


def cmd_import(args) -> int:
    """Print the acceptance read from a vLLM file (exit 2 on a bad one)."""
    from parity.importers.vllm import load_vllm
    from parity.report.imported import render_record

    record = load_vllm(args.file, args.num_drafts, args.format)
    if args.json:
        print(json.dumps(record.as_dict(), indent=2))
    else:
        render_record(record.as_dict(), console=_console())
    return EXIT_PASS


def cmd_models(args) -> int:
    """List the zoo, or build the embedded pair."""
    from rich.console import Console
    from rich.table import Table

    from parity.models.zoo import ASSETS, ZOO, availability

    if args.models_command == "list":
        table = Table(title="models", title_justify="left")
        table.add_column("name", no_wrap=True)   # names are what users type: never cut them
        for col in ("head", "status", "target", "draft"):
            table.add_column(col, overflow="fold")
        for name, entry in ZOO.items():
            status = availability(name)
            table.add_row(name, entry.head, status, entry.target_repo, entry.draft_repo)
        Console().print(table)
        return EXIT_PASS
    out = Path(args.out) if args.out else ASSETS / args.pair
    if args.pair == "tiny-llama3-eagle3":
        from parity.models.builder.build_eagle3 import build_tiny_eagle3_pair as build_pair
    else:
        from parity.models.builder.build import build_tiny_pair as build_pair
    info = build_pair(out, progress=lambda line: print(line, flush=True))
    if args.out is None:
        from parity.models.assets import write_manifest
        write_manifest(ASSETS)
    print(json.dumps(info.get("acceptance", {}), default=str))
    print(f"built {out}")
    return EXIT_PASS


def cmd_scenarios(args) -> int:
    """List scenario files with their description."""
    from rich.console import Console
    from rich.table import Table

    from parity.scenario import load_scenario

    folder = Path(args.dir)
    if not folder.is_dir():
        raise ParityInputError(f"{folder}: no such scenario folder")
    table = Table(title=f"scenarios in {folder}", title_justify="left")
    for col in ("file", "K", "seqs", "description"):
        table.add_column(col)
    for path in sorted(folder.glob("*.yaml")):
        s = load_scenario(path)
        table.add_row(path.name, str(s.num_speculative_tokens), str(s.max_num_seqs), s.description)
    Console().print(table)
    return EXIT_PASS


def default_run_id(model: str, scenario: str) -> str:
    """`<timestamp>-<model>-<scenario>`, the default run folder name under reports/."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{model}-{scenario}"


if __name__ == "__main__":
    sys.exit(main())
