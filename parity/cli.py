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

    report = sub.add_parser("report", help="re-render a saved run (no model needed)")
    report.add_argument("dir", help="a run folder holding summary.json")

    models = sub.add_parser("models", help="list or build models")
    models_sub = models.add_subparsers(dest="models_command", required=True, parser_class=_Parser)
    models_sub.add_parser("list", help="the model zoo and what is available here")
    build = models_sub.add_parser("build", help="train the embedded tiny pair into parity/assets/")
    build.add_argument("--out", default=None, help="folder (default parity/assets/tiny-llama3-eagle)")

    scenarios = sub.add_parser("scenarios", help="list shipped scenarios")
    scenarios_sub = scenarios.add_subparsers(dest="scenarios_command", required=True, parser_class=_Parser)
    ls = scenarios_sub.add_parser("list", help="scenario files and what they reproduce")
    ls.add_argument("--dir", default="scenarios")
    return parser


def main(argv: list[str] | None = None) -> int:
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

    from parity.report.diagnosis import diagnosis_panel

    request = RunRequest.from_args(args)
    outcome = run_session(request, show_progress=not args.quiet)
    diagnosis = outcome.summary.get("diagnosis")
    render(outcome.summary, diagnosis_panel=diagnosis_panel(diagnosis) if diagnosis else None)
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
    from rich.table import Table

    from parity.faults.catalog import FAULTS

    table = Table(title="fault catalog (--inject NAME)", title_justify="left")
    for col in ("name", "kind", "strikes in", "seed", "scenario", "shows in"):
        table.add_column(col)
    for f in FAULTS.values():
        table.add_row(f.name, f.kind, f.site, f.seed, f.scenario, ", ".join(f.manifests_in))
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
    from parity.report.diagnosis import diagnosis_panel

    diagnosis = summary.get("diagnosis")
    render(summary, diagnosis_panel=diagnosis_panel(diagnosis) if diagnosis else None)
    return EXIT_DRIFT if summary.get("verdict") == "drift" else EXIT_PASS


def cmd_models(args) -> int:
    """List the zoo, or build the embedded pair."""
    from rich.console import Console
    from rich.table import Table

    from parity.models.zoo import ASSETS, ZOO, availability

    if args.models_command == "list":
        table = Table(title="models", title_justify="left")
        for col in ("name", "head", "status", "target", "draft"):
            table.add_column(col)
        for name, entry in ZOO.items():
            status = availability(name)
            table.add_row(name, entry.head, status, entry.target_repo, entry.draft_repo)
        Console().print(table)
        return EXIT_PASS
    from parity.models.builder.build import build_tiny_pair

    out = Path(args.out) if args.out else ASSETS / "tiny-llama3-eagle"
    info = build_tiny_pair(out, progress=lambda line: print(line, flush=True))
    print(json.dumps(info.get("acceptance_estimate", {}), default=str))
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
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{model}-{scenario}"


if __name__ == "__main__":
    sys.exit(main())
