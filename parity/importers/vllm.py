"""Acceptance from vLLM: its Prometheus metrics text, or what its offline EAGLE example prints.

(a) Prometheus text of the metrics endpoint (`curl host:8000/metrics > m.txt`):
    vllm:spec_decode_num_drafts, vllm:spec_decode_num_draft_tokens,
    vllm:spec_decode_num_accepted_tokens and
    vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}, each a counter
    that may carry a `_total` suffix and extra labels (model_name, engine, ...).
    Samples are summed over every label set other than `position`; `_created`
    samples are ignored. Exact counts: compared statistically.
(b) The text of examples/offline_inference/eagle.py (spec_decode.py in newer
    vLLM): "mean acceptance length: 2.82" and "acceptance at token 0:0.77"
    (or "...token 0: 0.77"), plus "num_drafts: N" in newer versions. Rates
    rounded to two decimals: with num_drafts (printed or given) counts are
    derived and marked approximate, without it the gate compares by tolerance.

Both become the AcceptanceRecord every gate comparison takes. Problems are one
ParityInputError line naming the file (and line).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from parity.analysis.sources import AcceptanceRecord, from_rates, with_num_drafts
from parity.errors import ParityInputError
from parity.files import read_text_file

PREFIX = "vllm:spec_decode_"
MAX_COUNT = 1 << 53     # above this a float counter is no longer an exact count (and the statistics overflow)
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_RATE = re.compile(r"acceptance at token\s+(\d+)\s*:\s*([0-9.]+(?:[eE][-+]?\d+)?)\s*$")
_LENGTH = re.compile(r"mean acceptance length\s*:\s*([0-9.]+(?:[eE][-+]?\d+)?)\s*$")
_COUNT = re.compile(r"(num_drafts|num_draft_tokens|num_accepted_tokens)\s*:\s*([0-9.]+)\s*$")


def _labels(text: str, where: str) -> dict[str, str]:
    labels, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise ParityInputError(f"{where}: malformed labels {{{text}}}")
        labels[m.group(1)] = m.group(2)
        pos = m.end()
    return labels


def _counter(name: str) -> str | None:
    """The spec-decode counter a sample name belongs to (None for other metrics and _created)."""
    if not name.startswith(PREFIX):
        return None
    base = name[len(PREFIX):]
    if base.endswith("_total"):
        base = base[: -len("_total")]
    return base if base in COUNTERS else None


def parse_prometheus(text: str, source: str = "<metrics>") -> AcceptanceRecord:
    """Acceptance counts from Prometheus exposition text (see the module docstring)."""
    if text and not text.endswith("\n"):
        raise ParityInputError(f"{source}: truncated (the last line ends without a newline; "
                               f"Prometheus text ends with one)")
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source}:{number}"
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ParityInputError(f"{where}: not a Prometheus sample line (truncated?): {line[:60]!r}")
        counter = _counter(m.group(1))
        if counter is None:
            continue
        labels = _labels(m.group(2) or "", where)
        try:
            value = float(m.group(3))
        except ValueError:
            raise ParityInputError(f"{where}: value {m.group(3)!r} is not a number") from None
        if not math.isfinite(value) or not 0 <= value <= MAX_COUNT:
            raise ParityInputError(f"{where}: counter value {value} is not a count in 0..2**53")
        if counter == "num_accepted_tokens_per_pos":
            if not labels.get("position", "").isdigit():
                raise ParityInputError(f"{where}: per-position counter without a numeric position label")
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        else:
            totals[counter] = totals.get(counter, 0.0) + value
    if not totals and not per_pos:
        raise ParityInputError(f"{source}: no {PREFIX}* counters (was speculative decoding on, "
                               f"and is this the /metrics text?)")
    if "num_drafts" not in totals:
        raise ParityInputError(f"{source}: no {PREFIX}num_drafts counter (truncated?)")
    if not per_pos:
        raise ParityInputError(f"{source}: no {PREFIX}num_accepted_tokens_per_pos counters (truncated?)")
    k = max(per_pos) + 1
    drafts = round(totals["num_drafts"])
    if "num_draft_tokens" in totals and drafts:
        k_tokens = totals["num_draft_tokens"] / drafts
        if abs(k_tokens - round(k_tokens)) < 1e-9 and round(k_tokens) > k:
            k = round(k_tokens)
    missing = [i for i in range(k) if i not in per_pos]
    if missing:
        raise ParityInputError(f"{source}: per-position counters missing for position(s) "
                               f"{', '.join(map(str, missing))} of 0..{k - 1} (truncated?)")
    counts = [round(per_pos[i]) for i in range(k)]
    if drafts <= 0:
        raise ParityInputError(f"{source}: {PREFIX}num_drafts is 0: no drafts were made")
    if any(c > drafts for c in counts) or any(a < b for a, b in zip(counts, counts[1:])):
        raise ParityInputError(f"{source}: per-position counts {counts} are inconsistent with "
                               f"{drafts} drafts (they must be non-increasing and <= num_drafts)")
    rates = [c / drafts for c in counts]
    return AcceptanceRecord(Path(source).stem, "prometheus", tuple(rates), 1 + sum(counts) / drafts, drafts,
                            tuple(counts), False, source)


def parse_example_output(text: str, source: str = "<text>", num_drafts: int | None = None) -> AcceptanceRecord:
    """Acceptance from the printed text of vLLM's offline EAGLE example (see the module docstring)."""
    rates: dict[int, float] = {}
    seen_at: dict[int, int] = {}
    length, counts = None, {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if m := _RATE.search(line):
            i = int(m.group(1))
            if i in rates:
                raise ParityInputError(f"{source}:{number}: 'acceptance at token {i}' again (first on line "
                                       f"{seen_at[i]}): one run per file, please split it")
            rates[i], seen_at[i] = float(m.group(2)), number
        elif m := _LENGTH.search(line):
            length = float(m.group(1))
        elif m := _COUNT.search(line):
            counts[m.group(1)] = float(m.group(2))
    if length is not None and not math.isfinite(length):
        raise ParityInputError(f"{source}: mean acceptance length {length} is not a finite number")
    if not rates:
        raise ParityInputError(f"{source}: no 'acceptance at token i: rate' lines (neither vLLM's printed "
                               f"acceptance nor Prometheus metrics)")
    k = max(rates) + 1
    missing = [i for i in range(k) if i not in rates]
    if missing:
        raise ParityInputError(f"{source}: acceptance missing for token position(s) {', '.join(map(str, missing))}")
    bad = [i for i in range(k) if not 0.0 <= rates[i] <= 1.0]
    if bad:
        raise ParityInputError(f"{source}: acceptance at token {bad[0]} is {rates[bad[0]]}, not a rate in 0..1")
    record = from_rates(Path(source).stem, "vllm-text", [rates[i] for i in range(k)], length, source)
    printed = counts.get("num_drafts")
    if printed is not None and printed <= 0:
        raise ParityInputError(f"{source}: num_drafts is 0: no drafts were made")
    if printed is not None and not printed <= MAX_COUNT:
        raise ParityInputError(f"{source}: num_drafts {printed} is not a count in 1..2**53")
    drafts = num_drafts if num_drafts is not None else (round(printed) if printed is not None else None)
    return with_num_drafts(record, drafts) if drafts is not None else record


def detect_format(text: str) -> str:
    """"prometheus" when the text holds spec-decode metric samples or # TYPE lines, else "text"."""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("# TYPE ", "# HELP ", PREFIX)):
            return "prometheus"
    return "text"


def load_vllm(path: str | Path, num_drafts: int | None = None, fmt: str = "auto") -> AcceptanceRecord:
    """Read one vLLM acceptance file; `num_drafts` gives counts to a rates-only record."""
    path = Path(path)
    if num_drafts is not None and not 1 <= num_drafts <= MAX_COUNT:
        raise ParityInputError(f"--num-drafts must be in 1..2**53, got {num_drafts}")
    if not path.exists():
        raise ParityInputError(f"{path}: no such file")
    text = read_text_file(path, "vLLM metrics or printed output")
    if not text.strip():
        raise ParityInputError(f"{path}: empty file")
    kind = detect_format(text) if fmt == "auto" else fmt
    if kind == "prometheus":
        return parse_prometheus(text, str(path))
    if kind == "text":
        return parse_example_output(text, str(path), num_drafts)
    raise ParityInputError(f"unknown import format {fmt!r} (auto, prometheus, text)")
