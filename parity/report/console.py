"""Rich terminal rendering of a run summary. Reads summary data only; computes nothing."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from parity.report.modes import NO_NODE, SHORT, no_node, refused
from parity.report.threeway import (flips_cell, logprob_cell, numerics_lines, reference_cell, unpadded_lines,
                                    verdict_words)

VERDICT_CELL = {"pass": "PASS", "drift": "DRIFT", "not_exercised": "IDLE"}


def _delta_style(delta: float, drift: bool) -> str:
    if drift:
        return "bold red"
    if abs(delta) > 1e-12:
        return "yellow"
    return "green"


def acceptance_table(summary: dict) -> Table:
    modes = summary["modes"]
    names = list(modes)
    ref = modes.get("eager")
    k = summary["k"]
    drafts = ref["num_drafts"] if ref else next(iter(modes.values()))["num_drafts"]
    table = Table(title=f"Per-position acceptance  (K={k}, {drafts} drafts in eager)", title_justify="left",
                  header_style="bold", pad_edge=False)
    table.add_column("pos", justify="right")
    for name in names:
        table.add_column(SHORT.get(name, name), justify="right")
    for i in range(k):
        cells = []
        for name in names:
            m = modes[name]
            rate = m["acceptance_per_position"][i]
            if refused(m):
                cells.append(Text(refused(m), style="bold red"))
            elif no_node(m, i):
                cells.append(Text(NO_NODE, style="dim"))
            elif name == "eager" or ref is None or no_node(ref, i):
                cells.append(Text(f"{rate:.3f}"))
            else:
                delta = rate - ref["acceptance_per_position"][i]
                cells.append(Text(f"{rate:.3f} {delta:+.2f}", style=_delta_style(delta, m["position_drift"][i])))
        table.add_row(str(i), *cells)
    table.add_section()
    row = []
    for name in names:
        m = modes[name]
        text = f"{m['mean_acceptance_length']:.3f}"
        if refused(m):
            row.append(Text(refused(m), style="bold red"))
        elif ref is not None and name != "eager":
            delta = m["mean_acceptance_length"] - ref["mean_acceptance_length"]
            row.append(Text(f"{text} {delta:+.2f}", style=_delta_style(delta, m["verdict"] == "drift")))
        else:
            row.append(Text(text))
    table.add_row("len", *row)
    table.add_row("ref=", *[Text(reference_cell(m), style=_reference_style(m)) for m in modes.values()])
    table.add_row("tok=", *[Text("-", style="dim") if refused(m) else
                            Text("yes", style="green") if m["tokens_equal_to_eager"] else Text("no", style="yellow")
                            for m in modes.values()])
    table.add_row("|Δlp|", *[Text(logprob_cell(m)) for m in modes.values()])
    table.add_row("flips", *[Text(flips_cell(m)) for m in modes.values()])
    table.add_row("", *[Text(VERDICT_CELL.get(m["verdict"], m["verdict"].upper()),
                             style={"pass": "bold green", "drift": "bold red"}.get(m["verdict"], "bold yellow"))
                        for m in modes.values()])
    return table


def _reference_style(m: dict) -> str:
    ref = m.get("reference")
    return "dim" if ref is None else ("green" if ref["bitwise_equal"] else "bold red")


def numerics_panel(summary: dict) -> Panel | None:
    """Padding numerics (a reference against eager; a drift only beyond the fixed bound), and the unpadded
    single-request check when it ran."""
    lines = numerics_lines(summary) + unpadded_lines(summary)
    if not lines:
        return None
    return Panel(Text("\n".join(lines)), title="NUMERICS: padded reference vs eager (judged by a fixed bound)",
                 title_align="left", border_style="yellow")


def divergence_panels(summary: dict) -> list[Panel]:
    """Where a drifting mode's tokens part from eager's (modes that pass part only by numerics)."""
    panels = []
    for mode, d in summary.get("divergences", {}).items():
        if summary["modes"][mode]["verdict"] != "drift":
            continue
        body = Text()
        body.append(f"request {d['req_id']}, output token {d['output_index']} (position {d['position']}, "
                    f"step {d['step']}); {d['num_requests_diverged']} request(s) diverged\n")
        body.append("eager: ", style="bold")
        body.append(d["reference_text"] + "\n")
        body.append(f"{mode}: ", style="bold")
        body.append(d["mode_text"], style="red")
        panels.append(Panel(body, title=f"first divergence: {mode} vs eager", title_align="left"))
    return panels


def reasons(summary: dict) -> Text:
    text = Text()
    for mode, m in summary["modes"].items():
        for reason in m["reasons"]:
            text.append(f"{mode}: ", style="bold red")
            text.append(reason + "\n")
    return text


def verdict_line(summary: dict) -> Text:
    word, style = {"drift": ("DRIFT", "bold red"), "not_exercised": ("NOT EXERCISED", "bold yellow")}.get(
        summary["verdict"], ("PASS ", "bold green"))
    return Text(f"{word} {summary['model']} / {summary['scenario']} ({summary['backend']}): "
                f"{verdict_words(summary)}", style=style)


def checkpoint_lines(summary: dict) -> list[Text]:
    """The folders and checksum a run loaded, for pairs given by path (embedded pairs have none)."""
    if not summary.get("target_path"):
        return []
    return [Text(f"target {summary['target_path']}", style="dim"),
            Text(f"draft  {summary.get('draft_path')}  ·  checksum {summary.get('model_checksum')}", style="dim")]


def render(summary: dict, console: Console | None = None, diagnosis_panel=None) -> None:
    console = console or Console()
    header = Text(f"{summary['model']}  ·  {summary['scenario']}  ·  backend {summary['backend']}  ·  "
                  f"T={summary['temperature']}  ·  seed {summary['seed']}", style="dim")
    parts = [header, *checkpoint_lines(summary), acceptance_table(summary), *divergence_panels(summary)]
    numerics = numerics_panel(summary)
    if numerics is not None:
        parts.append(numerics)
    why = reasons(summary)
    if why.plain:
        parts.append(why)
    if diagnosis_panel is not None:
        parts.append(diagnosis_panel)
    console.print(Group(*parts))
    console.print(verdict_line(summary))
