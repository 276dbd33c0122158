"""report.md: a run summary as GitHub-flavoured Markdown (fits a CI step summary).

Reads summary data only; computes nothing but formatting. Never prints the
creation time, so a saved run always renders the same text.
"""

from __future__ import annotations

from pathlib import Path

from parity.diagnosis.kinds import MEANING, NAMED, UNEXPLAINED
from parity.diagnosis.panel import describe_where
from parity.report.atomic import write_text
from parity.report.modes import NO_NODE, refused
from parity.report.threeway import flips_cell, logprob_cell, numerics_lines, reference_cell, unpadded_lines

TITLE = {"pass": "PASS", "drift": "DRIFT", "not_exercised": "NOT EXERCISED"}


def cell(text) -> str:
    """Escape a value for a Markdown table cell (pipes, newlines)."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _longest_backtick_run(text: str) -> int:
    longest = current = 0
    for ch in text:
        current = current + 1 if ch == "`" else 0
        longest = max(longest, current)
    return longest


def code_span(text) -> str:
    """Inline code that survives backticks inside `text`."""
    text = str(text)
    fence = "`" * (_longest_backtick_run(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def fenced(text: str) -> str:
    """A fenced code block longer than any backtick run inside `text`."""
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return f"{fence}text\n{text}\n{fence}"


def header_line(summary: dict) -> str:
    """`## parity: PASS · model · scenario · backend`."""
    verdict = TITLE.get(summary.get("verdict"), str(summary.get("verdict")).upper())
    return (f"## parity: {verdict} · model {code_span(summary['model'])} · scenario "
            f"{code_span(summary['scenario'])} · backend {code_span(summary['backend'])}")


def acceptance_table(summary: dict) -> list[str]:
    """Per-position acceptance: eager, then every mode with its delta; then length, parity, logprobs."""
    modes = summary["modes"]
    ref = modes.get("eager")
    names = list(modes)
    lines = ["| position | " + " | ".join(cell(n) for n in names) + " |",
             "|---:|" + "---:|" * len(names)]

    def with_delta(name: str, value: float | None, ref_value: float | None, drift: bool, digits: int = 3) -> str:
        if refused(modes[name]):
            return f"**{refused(modes[name])}**"     # refused before it ran, or stopped before a wrong graph
        if value is None:
            return NO_NODE                           # no draft had a node there: no rate, not a rate of 0
        text = f"{value:.{digits}f}"
        if ref_value is not None and name != "eager":
            text += f" ({value - ref_value:+.{digits}f})"
        return f"**{text}** ✗" if drift else text

    for i in range(summary["k"]):
        row = [with_delta(n, m["acceptance_per_position"][i], ref["acceptance_per_position"][i] if ref else None,
                          m["position_drift"][i]) for n, m in modes.items()]
        lines.append(f"| {i} | " + " | ".join(row) + " |")
    row = [with_delta(n, m["mean_acceptance_length"], ref["mean_acceptance_length"] if ref else None,
                      False) for n, m in modes.items()]
    lines.append("| mean acceptance length | " + " | ".join(row) + " |")
    lines.append("| drafts | " + " | ".join(str(m["num_drafts"]) for m in modes.values()) + " |")
    lines.append("| = padded reference | " + " | ".join(
        f"**{reference_cell(m)}**" if reference_cell(m) == "DIFFERS" else reference_cell(m)
        for m in modes.values()) + " |")
    lines.append("| tokens = eager | " + " | ".join("yes" if m["tokens_equal_to_eager"] else "no"
                                                     for m in modes.values()) + " |")
    lines.append("| numerics max \\|Δlogprob\\| | " + " | ".join(logprob_cell(m) for m in modes.values()) + " |")
    lines.append("| numerics flips | " + " | ".join(flips_cell(m) for m in modes.values()) + " |")
    lines.append("| verdict | " + " | ".join(TITLE.get(m["verdict"], m["verdict"]) if m["verdict"] == "pass"
                                              else f"**{TITLE.get(m['verdict'], m['verdict'])}**"
                                              for m in modes.values()) + " |")
    return lines


def numerics_section(summary: dict) -> list[str]:
    """Padding numerics of each padded reference against eager (a drift only beyond the fixed bound), and
    the unpadded single-request check when it ran."""
    lines = numerics_lines(summary) + unpadded_lines(summary)
    if not lines:
        return []
    return ["### Numerics (padded reference vs eager; judged by a fixed bound)", "", *[f"- {x}" for x in lines]]


def reasons_section(summary: dict) -> list[str]:
    """Every mode's reasons for drift, one bullet each."""
    items = [f"- {code_span(mode)}: {r}" for mode, m in summary["modes"].items() for r in m.get("reasons", [])]
    return ["### Reasons", "", *items] if items else []


def divergence_section(summary: dict) -> list[str]:
    """The first divergent token window of every mode that diverged."""
    lines = []
    for mode, d in (summary.get("divergences") or {}).items():
        if summary["modes"][mode]["verdict"] != "drift":
            continue
        lines += [f"### First divergence: {code_span(mode)} vs eager", "",
                  f"request {d['req_id']}, output token {d['output_index']} (position {d['position']}, "
                  f"step {d['step']}); {d['num_requests_diverged']} request(s) diverged", "",
                  fenced(f"eager: {d['reference_text']}\n{mode}: {d['mode_text']}"), ""]
    return lines[:-1] if lines else []


def diagnosis_section(summary: dict) -> list[str]:
    """Kind, meaning, buffers, where and evidence of the diagnosis, when there is one."""
    d = summary.get("diagnosis")
    if not d:
        return []
    kind = d.get("kind", UNEXPLAINED)
    lines = ["### Diagnosis", "", f"- kind: **{kind}** — {MEANING.get(kind, '')}"]
    if d.get("mode"):
        lines.append(f"- mode: {code_span(d['mode'])}")
    if d.get("buffers"):
        lines.append(f"- {NAMED.get(kind, 'buffers')}: " + ", ".join(code_span(b) for b in d["buffers"]))
    if d.get("phase"):
        lines.append(f"- where: {describe_where(d)}")
    if d.get("captured_address") is not None and d.get("live_address") not in (None, d["captured_address"]):
        lines.append(f"- address: captured 0x{d['captured_address']:x}, live 0x{d['live_address']:x}")
    if d.get("experiment"):
        lines.append(f"- isolated by: {d['experiment']}")
    for title, key in (("also restoring parity", "also"), ("evidence", "evidence"), ("ruled out", "ruled_out")):
        if d.get(key):
            lines.append(f"- {title}:")
            lines += [f"  - {e}" for e in d[key]]
    lines.append(f"- replays: {d.get('replays', 0)}")
    return lines


def render_markdown(summary: dict) -> str:
    """The whole report.md for one run summary (see the module docstring)."""
    parts = [header_line(summary), "",
             f"K={summary['k']} · T={summary['temperature']} · seed {summary['seed']} · "
             f"{summary.get('num_requests', '?')} requests", "",
             "### Per-position acceptance", "", *acceptance_table(summary)]
    for section in (numerics_section(summary), reasons_section(summary), divergence_section(summary),
                    diagnosis_section(summary)):
        if section:
            parts += ["", *section]
    return "\n".join(parts) + "\n"


def write_markdown(folder: Path, summary: dict) -> None:
    """Extra writer for artifacts.write_run: report.md in the run folder (itself written atomically)."""
    write_text(Path(folder) / "report.md", render_markdown(summary))
