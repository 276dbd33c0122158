"""The CI gate's verdict: every comparison it makes, as checks with numbers.

A gate compares pairs of acceptance records (a graph mode with eager, a mode
with its committed baseline, one imported vLLM run with another). Per pair:

- acceptance at every position (stats.proportion_test) and the mean
  acceptance length (delta method), when both records have draft counts;
  all these tests of the whole gate form one family, corrected with Holm at
  the scenario's alpha, and a significant difference is drift only when it is
  at least `acceptance_min_effect` (a rate, or tokens of mean length);
- by tolerance when a record has rates only: |Δ| >= acceptance_min_effect;
- for a graph mode: bit-for-bit parity with its strict padded reference
  (reference_parity.py; exact, the evidence compare.py gathers for `parity
  run`), and a padding that stays inert when poisoned. Differences between
  the reference and plain eager are padding numerics: reported by `parity
  run`, never a gate failure; acceptance against eager is what the
  statistical checks above judge.

The verdict is "drift" when any check fails. Nothing here prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from parity.analysis import stats
from parity.analysis.reference_parity import ReferenceParity, describe
from parity.analysis.sources import AcceptanceRecord
from parity.analysis.tolerances import Tolerances
from parity.errors import ParityInputError


@dataclass(frozen=True)
class Pairing:
    """One comparison the gate makes: `subject` against `reference`."""

    subject: AcceptanceRecord
    reference: AcceptanceRecord
    reference_name: str                      # "eager", "baseline" or the reference import's label
    parity: ReferenceParity | None = None    # the subject against its strict padded reference, bit for bit
    padding: dict | None = None              # {"inert", "graph_equals_clean_reference"} after a difference


@dataclass
class GateCheck:
    """One pass/fail line of the gate (one JUnit test case)."""

    subject: str
    reference: str
    name: str                 # "acceptance position 0", "mean acceptance length", "token parity", ...
    kind: str                 # position | length | tokens | logprob | drafts
    passed: bool
    message: str
    position: int | None = None
    method: str = ""          # z | fisher | delta | tolerance | exact
    p: float | None = None
    p_adjusted: float | None = None
    numbers: dict = field(default_factory=dict)


@dataclass
class GateResult:
    """All checks, the family they were corrected in, and the verdict."""

    checks: list[GateCheck]
    alpha: float
    min_effect: float
    correction: str
    family_size: int
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.passed]

    @property
    def verdict(self) -> str:
        return "drift" if self.failures else "pass"

    def as_dict(self) -> dict:
        """JSON-ready data (what renderers and summary.json's `gate` read)."""
        return {"verdict": self.verdict, "alpha": self.alpha, "min_effect": self.min_effect,
                "correction": self.correction, "family_size": self.family_size, "notes": list(self.notes),
                "num_checks": len(self.checks), "num_failures": len(self.failures),
                "checks": [asdict(c) for c in self.checks]}


def validate_pairings(pairings: list[Pairing]) -> None:
    """Refuse a vacuous gate: nothing compared, a record with zero drafts or no positions, K mismatch."""
    if not pairings:
        raise ParityInputError("nothing to compare (give a graph mode, a --baseline, or two --import files)")
    for p in pairings:
        for r in (p.subject, p.reference):
            if r.k == 0:
                raise ParityInputError(f"{r.label}: no acceptance positions")
            if r.num_drafts is not None and r.num_drafts <= 0:
                raise ParityInputError(f"{r.label}: zero drafts; nothing was speculated, so nothing can be compared")
        if p.subject.k != p.reference.k:
            raise ParityInputError(f"{p.subject.label} has K={p.subject.k} but {p.reference.label} has "
                                   f"K={p.reference.k}; they are not the same setup")


def _by_tolerance(delta: float, tolerance: float) -> str:
    sign = "<" if abs(delta) < tolerance else ">="
    return (f"|Δ| {sign} tolerance {tolerance:g} (rates only, no draft counts: compared by tolerance; "
            f"give --num-drafts N for a statistical test)")


def _acceptance_checks(pair: Pairing, tol: Tolerances) -> list[GateCheck]:
    s, r, ref = pair.subject, pair.reference, pair.reference_name
    checks = []
    if not (s.has_counts and r.has_counts):
        for i, (rate, ref_rate) in enumerate(zip(s.rates, r.rates)):
            delta = rate - ref_rate
            checks.append(GateCheck(
                s.label, ref, f"acceptance position {i}", "position", abs(delta) < tol.acceptance_min_effect,
                f"position {i}: acceptance {rate:.3f} vs {ref} {ref_rate:.3f}, Δ {delta:+.3f}, "
                f"{_by_tolerance(delta, tol.acceptance_min_effect)}",
                i, "tolerance", numbers={"rate": rate, "reference_rate": ref_rate, "delta": delta}))
        delta = s.mean_acceptance_length - r.mean_acceptance_length
        checks.append(GateCheck(
            s.label, ref, "mean acceptance length", "length", abs(delta) < tol.acceptance_min_effect,
            f"mean acceptance length {s.mean_acceptance_length:.3f} vs {ref} {r.mean_acceptance_length:.3f}, "
            f"Δ {delta:+.3f}, {_by_tolerance(delta, tol.acceptance_min_effect)}", None, "tolerance",
            numbers={"value": s.mean_acceptance_length, "reference": r.mean_acceptance_length, "delta": delta}))
        return checks
    for t in stats.position_tests(r.num_drafts, r.accepted_per_position, s.num_drafts, s.accepted_per_position):
        checks.append(GateCheck(
            s.label, ref, f"acceptance position {t.position}", "position", True, "", t.position, t.method, t.p,
            numbers={"accepted": t.accepted, "num_drafts": t.drafts, "rate": t.rate, "ci95": list(t.ci),
                     "reference_accepted": t.ref_accepted, "reference_num_drafts": t.ref_drafts,
                     "reference_rate": t.ref_rate, "reference_ci95": list(t.ref_ci), "delta": t.delta,
                     "approximate": s.approximate or r.approximate}))
    d = stats.mean_length_difference(r.num_drafts, r.accepted_per_position, s.num_drafts, s.accepted_per_position)
    checks.append(GateCheck(
        s.label, ref, "mean acceptance length", "length", True, "", None, "delta" if d.enough_drafts else "none",
        d.p if d.enough_drafts else None,
        numbers={"value": d.other, "reference": d.reference, "delta": d.diff, "ci95": list(d.ci95),
                 "ci95_method": "delta", "num_drafts": s.num_drafts, "reference_num_drafts": r.num_drafts,
                 "accepted_per_position": list(s.accepted_per_position),
                 "reference_accepted_per_position": list(r.accepted_per_position)}))
    return checks


def _length_message(c: GateCheck, seed: int) -> str:
    n = c.numbers
    if not c.passed:   # a failure gets the seeded bootstrap over drafts as a second interval
        n["ci95"] = list(stats.bootstrap_length_interval(
            n["reference_num_drafts"], n["reference_accepted_per_position"], n["num_drafts"],
            n["accepted_per_position"], seed=seed))
        n["ci95_method"] = "bootstrap over drafts"
    lo, hi = n["ci95"]
    tested = (f"p={c.p:.2g} (delta method), adjusted p={c.p_adjusted:.2g}" if c.p is not None else
              f"not tested: fewer than {stats.MIN_DRAFTS_FOR_LENGTH} drafts a side")
    return (f"mean acceptance length {n['value']:.3f} ({n['num_drafts']} drafts) vs {c.reference} "
            f"{n['reference']:.3f} ({n['reference_num_drafts']} drafts), Δ {n['delta']:+.3f} "
            f"(95% CI {lo:+.2f}..{hi:+.2f}, {n['ci95_method']}), {tested}")


def _parity_check(pair: Pairing) -> GateCheck:
    ev, name = pair.parity, pair.subject.label
    inert = (pair.padding or {}).get("inert", True)
    if ev.bitwise_equal:
        msg = f"bit for bit equal to its padded reference {ev.reference} ({ev.rows_compared} records)"
    else:
        msg = (f"differs from its padded reference {ev.reference} in {ev.rows_differing} of {ev.rows_compared} "
               f"records; first: {describe(ev.first_difference)}")
        if not inert:
            msg += "; padding is not inert (the reference changes when its padding is poisoned)"
    return GateCheck(name, ev.reference, "reference parity", "reference", ev.bitwise_equal and inert, msg,
                     method="exact", numbers=asdict(ev))


def evaluate_gate(pairings: list[Pairing], tol: Tolerances, seed: int = 0,
                  correction: str = "holm") -> GateResult:
    """Run every check of every pairing; correct the statistical ones as one family."""
    validate_pairings(pairings)
    checks: list[GateCheck] = []
    notes: list[str] = []
    for pair in pairings:
        checks.extend(_acceptance_checks(pair, tol))
        if pair.parity is not None:
            checks.append(_parity_check(pair))
        for rec in (pair.subject, pair.reference):
            if rec.approximate and f"{rec.label}:" not in " ".join(notes):
                notes.append(f"{rec.label}: counts derived from rounded rates x {rec.num_drafts} drafts (approximate)")
            if not rec.has_counts and f"{rec.label}:" not in " ".join(notes):
                notes.append(f"{rec.label}: rates only; compared by tolerance (give --num-drafts for a test)")
    family = [c for c in checks if c.p is not None]
    for c, p_adj in zip(family, stats.adjust([c.p for c in family], correction)):
        c.p_adjusted = p_adj
        c.passed = not stats.is_drift(p_adj, c.numbers["delta"], tol.alpha, tol.acceptance_min_effect)
    for c in checks:
        if c.kind == "position" and c.method != "tolerance":
            t = stats.PositionTest(c.position, c.numbers["reference_accepted"], c.numbers["reference_num_drafts"],
                                   c.numbers["accepted"], c.numbers["num_drafts"], c.p, c.method, c.p_adjusted)
            c.message = stats.position_message(t, c.reference, tol.alpha)
        elif c.kind == "length" and c.method != "tolerance":
            c.message = _length_message(c, seed)
    return GateResult(checks, tol.alpha, tol.acceptance_min_effect, correction, len(family), notes)
