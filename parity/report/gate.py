"""Rendering of a gate report: rich console, Markdown, and the one-line verdict.

A gate report is plain data (gate_session builds it; `result` is
GateResult.as_dict()). Nothing here computes a statistic; the console's last
line is always the one-line verdict.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from parity.report.modes import SHORT
from parity.report.markdown import cell, code_span, render_markdown

PARITY_KINDS = ("reference",)


def comparisons(report: dict) -> dict[tuple[str, str], list[dict]]:
    """Checks grouped by (subject, reference), in the order the gate made them."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for c in report["result"]["checks"]:
        groups.setdefault((c["subject"], c["reference"]), []).append(c)
    return groups


def _row(checks: list[dict]) -> tuple[str, str, str, str]:
    positions = [c for c in checks if c["kind"] == "position"]
    bad = [str(c["position"]) for c in positions if not c["passed"]]
    pos_text = f"drift at {', '.join(bad)}" if bad else f"{len(positions)} ok"
    length = next((c for c in checks if c["kind"] == "length"), None)
    len_text = ""
    if length is not None:
        n = length["numbers"]
        len_text = f"{n['value']:.3f} ({n['delta']:+.3f})" + ("" if length["passed"] else " DRIFT")
    parity = [c for c in checks if c["kind"] in PARITY_KINDS]
    short = {"reference": "bitwise"}
    failed = [short[c["kind"]] for c in parity if not c["passed"]]
    par_text = "-" if not parity else (f"{', '.join(failed)} FAIL" if failed else
                                       ", ".join(short[c["kind"]] for c in parity) + " ok")
    verdict = "PASS" if all(c["passed"] for c in checks) else "DRIFT"
    return pos_text, len_text, par_text, verdict


def failure_summary(report: dict) -> str:
    """Failed checks grouped by comparison: `full vs eager: positions 1, 2; draft parity (draft position 2)`."""
    parts = []
    for (subject, reference), checks in comparisons(report).items():
        failed = [c for c in checks if not c["passed"]]
        if not failed:
            continue
        names = []
        positions = [str(c["position"]) for c in failed if c["kind"] == "position"]
        if positions:
            names.append(("position " if len(positions) == 1 else "positions ") + ", ".join(positions))
        for c in failed:
            first = (c.get("numbers") or {}).get("first_difference") if c["kind"] == "reference" else None
            if first:
                index = (f"output token {first['output_index']}" if "output_index" in first
                         else f"draft {first['draft_index']}")
                names.append(f"{c['name']} (step {first['step']}, request {first['req_id']}, {index})")
            elif c["kind"] != "position":
                names.append(c["name"])
        parts.append(f"{subject} vs {reference}: {'; '.join(names)}")
    return " | ".join(parts)


def verdict_line(report: dict) -> str:
    """The gate's one-line verdict (the last line of its output)."""
    result = report["result"]
    what = f"{report.get('model') or 'vllm import'} / {report.get('scenario') or report.get('reference')}"
    backend = report.get("backend") or "-"
    n = result["num_checks"]
    if result["verdict"] == "pass":
        return (f"GATE PASS {what} ({backend}): {n} checks in {len(comparisons(report))} comparison(s), "
                f"alpha {result['alpha']:g}")
    return f"GATE DRIFT {what} ({backend}): {result['num_failures']} of {n} checks failed: {failure_summary(report)}"


def render_gate(report: dict, console: Console | None = None) -> None:
    """Print the gate report: header, per-comparison table, failures, notes, then the verdict line."""
    console = console or Console()
    result = report["result"]
    head = f"parity gate · {report.get('model') or 'vllm import'} · {report.get('scenario') or '-'} · " \
           f"backend {report.get('backend') or '-'}"
    console.print(Text(head, style="dim"))
    console.print(Text(f"alpha {result['alpha']:g}, {result['correction'].capitalize()} over {result['family_size']} "
                       f"tests, minimum effect {result['min_effect']:g}", style="dim"))
    table = Table(header_style="bold", pad_edge=False, box=box.SIMPLE_HEAD)
    for col, justify in (("verdict", "left"), ("comparison", "left"), ("positions", "left"),
                         ("mean length", "right"), ("parity", "left")):
        table.add_column(col, justify=justify)
    for (subject, reference), checks in comparisons(report).items():
        pos, length, par, verdict = _row(checks)
        style = "bold green" if verdict == "PASS" else "bold red"
        name = f"{SHORT.get(subject, subject)} vs {SHORT.get(reference, reference)}"
        table.add_row(Text(verdict, style=style), name, pos, length.replace("(", "").replace(")", ""),
                      par.replace(",", ""))
    console.print(table)
    failed = [c for c in result["checks"] if not c["passed"]]
    for c in failed:
        console.print(Text.assemble((f"{c['subject']} vs {c['reference']}: ", "bold red"), c["message"]))
    for note in result.get("notes", []) + ([report["baseline_note"]] if report.get("baseline_note") else []):
        console.print(Text(f"note: {note}", style="yellow"))
    style = "bold green" if result["verdict"] == "pass" else "bold red"
    console.print(Text(verdict_line(report), style=style), soft_wrap=True)   # one physical line


def render_gate_markdown(report: dict, summary: dict | None = None) -> str:
    """The gate as Markdown (a CI step summary), followed by the run's report.md when there is a run."""
    result = report["result"]
    verdict = result["verdict"].upper()
    lines = [f"## parity gate: {verdict} · model {code_span(report.get('model') or 'vllm import')} · "
             f"scenario {code_span(report.get('scenario') or '-')} · backend {code_span(report.get('backend') or '-')}",
             "", f"alpha {result['alpha']:g} · {result['correction'].capitalize()} over {result['family_size']} tests · "
                 f"minimum effect {result['min_effect']:g} · {result['num_checks']} checks, "
                 f"{result['num_failures']} failed", "",
             "| comparison | positions | mean acceptance length | parity | verdict |",
             "|---|---|---:|---|---|"]
    for (subject, reference), checks in comparisons(report).items():
        pos, length, par, v = _row(checks)
        lines.append(f"| {cell(subject)} vs {cell(reference)} | {cell(pos)} | {cell(length)} | {cell(par)} | "
                     + (v if v == "PASS" else f"**{v}**") + " |")
    failed = [c for c in result["checks"] if not c["passed"]]
    if failed:
        lines += ["", "### Failed checks", ""]
        lines += [f"- {code_span(c['subject'])} vs {c['reference']} · {c['name']}: {c['message']}" for c in failed]
    notes = result.get("notes", []) + ([report["baseline_note"]] if report.get("baseline_note") else [])
    if notes:
        lines += ["", "### Notes", "", *[f"- {n}" for n in notes]]
    lines += ["", f"**{verdict_line(report)}**"]
    text = "\n".join(lines) + "\n"
    if summary is not None:
        text += "\n---\n\n" + render_markdown(summary)
    return text
