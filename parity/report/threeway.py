"""The three-way verdict in words: graph vs its padded reference (the verdict), reference vs eager (numerics).

Shared by the console and Markdown renderers; reads summary data only.
"""

from __future__ import annotations


def reference_cell(m: dict) -> str:
    """'bitwise' when the mode equals its padded reference bit for bit, 'DIFFERS' when not, '-' for eager."""
    ref = m.get("reference")
    if ref is None:
        return "-"
    return "bitwise" if ref["bitwise_equal"] else "DIFFERS"


def logprob_cell(m: dict) -> str:
    """The padded reference's largest |Δ logprob| against eager on same-context tokens ('-' for eager)."""
    n = m.get("numerics")
    return "-" if n is None else f"{n['max_abs_logprob_diff']:.1e}"


def flips_cell(m: dict) -> str:
    """Token and draft flips of the padded reference against eager, with how many were near ties."""
    n = m.get("numerics")
    if n is None:
        return "-"
    flips = n["token_flips"] + n["draft_flips"]
    return f"{flips} ({n['near_ties']} tie)" if flips else "0"


def numerics_lines(summary: dict) -> list[str]:
    """One line per padded reference whose numerics differ from eager at all."""
    lines, seen = [], set()
    for mode, m in summary["modes"].items():
        n = m.get("numerics")
        if n is None or n["reference"] in seen:
            continue
        seen.add(n["reference"])
        if not (n["max_abs_logprob_diff"] or n["max_abs_draft_logprob_diff"] or n["token_flips"] or n["draft_flips"]):
            continue
        users = (summary.get("references", {}).get(n["reference"]) or {}).get("modes") or [mode]
        parts = [f"max |Δ logprob| {n['max_abs_logprob_diff']:.2e} (drafts {n['max_abs_draft_logprob_diff']:.2e})"]
        first = n.get("first_token_divergence")
        if n["token_flips"]:
            parts.append(f"{n['token_flips']} request(s) parted, first: request {first['req_id']} at output token "
                         f"{first['output_index']} (step {first['step']})")
        if n["draft_flips"]:
            parts.append(f"{n['draft_flips']} of {n['drafts_compared']} same-context drafts flipped")
        flips = n["token_flips"] + n["draft_flips"]
        if flips:
            parts.append(f"{n['near_ties']} of {flips} flip(s) at a near tie in eager")
        if n.get("bound") is not None:
            beyond = max(n["max_abs_logprob_diff"], n["max_abs_draft_logprob_diff"]) > n["bound"]
            parts.append(f"{'BEYOND' if beyond else 'within'} the padding-numerics bound {n['bound']:.3g}")
        lines.append(f"{n['reference']} ({', '.join(users)}) vs eager: " + "; ".join(parts))
    return lines


def unpadded_lines(summary: dict) -> list[str]:
    """`--check-unpadded`: one line on whether eager itself agrees with an unpadded single-request run."""
    u = summary.get("unpadded")
    return [u["line"]] if u else []


def verdict_words(summary: dict) -> str:
    graph = [m for m in summary["modes"] if summary["modes"][m].get("reference") is not None]
    drifted = [m for m, v in summary["modes"].items() if v["verdict"] == "drift"]
    if drifted:
        return ", ".join(drifted)
    idle = [m for m, v in summary["modes"].items() if v["verdict"] == "not_exercised"]
    if idle:
        return f"{', '.join(idle)}: no forward replayed a graph, so nothing was proved"
    if not graph:
        return f"{len(summary['modes'])} mode(s), no graph mode to judge"
    return f"{len(graph)} graph mode(s) bit for bit equal to their padded references"
