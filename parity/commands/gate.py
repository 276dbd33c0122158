"""`parity gate`: the CI gate on acceptance and parity drift, with baselines, JUnit and Markdown (docs/gate.md)."""

from __future__ import annotations

import sys

from parity.commands.common import console, engine_parts, requested_modes
from parity.commands.options import EXIT_DRIFT, EXIT_PASS
from parity.commands.outputs import check_out, save_run
from parity.errors import ParityInputError
from parity.harness.gate import GateRequest, check_output_path, run_gate
from parity.importers.vllm import MAX_COUNT
from parity.models.zoo import check_model_paths, scenario_of
from parity.report.atomic import write_json, write_text
from parity.report.gate import render_gate, render_gate_markdown
from parity.report.junit import write_junit
from parity.report.progress import mode_progress


def main(args) -> int:
    """Run (or import) every mode, compare with eager and the baseline; exit 0 pass, 1 drift, 2 bad input."""
    check_model_paths(args.model, args.target_path, args.draft_path)
    check_output_path(args.junit, "--junit")
    check_output_path(args.markdown, "--markdown")
    if args.num_drafts is not None and not 1 <= args.num_drafts <= MAX_COUNT:
        raise ParityInputError(f"--num-drafts must be in 1..2**53, got {args.num_drafts}")
    if args.imports and len(args.imports) >= 2:
        extra = [opt for opt, given in (("--baseline", args.baseline), ("--update-baseline", args.update_baseline),
                                        ("--inject", args.inject), ("--modes", requested_modes(args.modes)),
                                        ("--out", args.out)) if given]
        if extra:
            raise ParityInputError(f"{', '.join(extra)}: not with --import (imports compare files, not engine runs)")
    check_out(args)
    request = GateRequest(args.model, scenario_of(args.model, args.scenario), requested_modes(args.modes), args.backend,
                          **engine_parts(args), seed=args.seed, target_path=args.target_path,
                          draft_path=args.draft_path, dtype=args.dtype, baseline=args.baseline,
                          update_baseline=args.update_baseline, imports=tuple(args.imports),
                          num_drafts=args.num_drafts)
    with mode_progress(sys.stderr.isatty()) as progress:
        outcome = run_gate(request, progress)
    if outcome.summary is not None:
        outcome.report["faults"] = outcome.summary["faults"] = list(args.inject)
    if outcome.baseline is not None:
        write_json(*outcome.baseline)
    if args.junit:
        write_junit(args.junit, outcome.report)
    if args.markdown:
        write_text(args.markdown, render_gate_markdown(outcome.report, outcome.summary))
    if args.out and outcome.summary is not None:
        save_run(args, outcome.summary, outcome.runs, outcome.summary["scenario"])
    render_gate(outcome.report, console=console())
    return EXIT_DRIFT if outcome.verdict == "drift" else EXIT_PASS
