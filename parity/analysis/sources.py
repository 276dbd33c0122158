"""Acceptance records: what the gate compares, whatever produced it.

An engine run, a committed baseline, a vLLM metrics scrape and the text vLLM's
offline example prints all become one `AcceptanceRecord`: per-position
acceptance (vLLM's definitions), the number of drafts when known, and where
the numbers came from. Records with counts are compared statistically;
records with rates only (the printed text) are compared by tolerance, or by
counts derived from a number of drafts the user gives (`approximate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from parity.analysis.metrics import Acceptance, wilson_interval

ORIGINS = ("engine", "baseline", "prometheus", "vllm-text")


@dataclass(frozen=True)
class AcceptanceRecord:
    """Per-position acceptance of one run, with its provenance."""

    label: str                                   # what reports call it: "full", "baseline full", a file name
    origin: str                                  # one of ORIGINS
    rates: tuple[float, ...]                     # per-position acceptance rates
    mean_acceptance_length: float
    num_drafts: int | None = None                # None: rates only
    accepted_per_position: tuple[int, ...] | None = None
    approximate: bool = False                    # counts derived from rounded rates x a given number of drafts
    source: str = ""                             # file the record was read from, if any

    @property
    def k(self) -> int:
        return len(self.rates)

    @property
    def has_counts(self) -> bool:
        return self.num_drafts is not None and self.accepted_per_position is not None

    def acceptance(self) -> Acceptance:
        """The counts as metrics.Acceptance (raises ValueError for a rates-only record)."""
        if not self.has_counts:
            raise ValueError(f"{self.label}: no draft counts")
        return Acceptance(self.num_drafts, tuple(self.accepted_per_position))

    def as_dict(self) -> dict:
        """JSON-ready data."""
        return {"label": self.label, "origin": self.origin, "num_drafts": self.num_drafts,
                "accepted_per_position": list(self.accepted_per_position) if self.accepted_per_position else None,
                "acceptance_per_position": [round(r, 6) for r in self.rates],
                "acceptance_ci95": ([[round(v, 6) for v in wilson_interval(c, self.num_drafts)]
                                     for c in self.accepted_per_position] if self.has_counts else None),
                "mean_acceptance_length": round(self.mean_acceptance_length, 6),
                "approximate": self.approximate, "source": self.source}


def from_acceptance(label: str, origin: str, acc: Acceptance, source: str = "") -> AcceptanceRecord:
    """A record with exact counts."""
    return AcceptanceRecord(label, origin, tuple(acc.rates), acc.mean_acceptance_length, acc.num_drafts,
                            tuple(acc.accepted_per_position), False, source)


def from_rates(label: str, origin: str, rates, mean_acceptance_length: float | None = None,
               source: str = "") -> AcceptanceRecord:
    """A rates-only record; the mean length defaults to 1 + sum(rates) (vLLM's identity)."""
    rates = tuple(float(r) for r in rates)
    length = 1.0 + sum(rates) if mean_acceptance_length is None else float(mean_acceptance_length)
    return AcceptanceRecord(label, origin, rates, length, source=source)


def with_num_drafts(record: AcceptanceRecord, num_drafts: int) -> AcceptanceRecord:
    """Give a rates-only record counts: round(rate x drafts) per position, marked approximate.

    Counts are made non-increasing (rounding of nested rates can otherwise
    break the order by one). A record that has counts is returned unchanged.
    """
    if record.has_counts:
        return record
    counts, previous = [], num_drafts
    for rate in record.rates:
        previous = min(previous, max(0, round(rate * num_drafts)))
        counts.append(previous)
    return replace(record, num_drafts=num_drafts, accepted_per_position=tuple(counts), approximate=True)
