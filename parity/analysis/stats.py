"""Statistics of acceptance comparisons. Pure functions: numbers in, numbers out.

Per-position acceptance of two runs is compared as two binomial proportions:
Fisher's exact test when a 2x2 cell's expected count is small, the pooled
two-proportion z-test otherwise. A family of such tests (every position of
every compared mode) is corrected with Holm's step-down method, which bounds
the family-wise false-alarm rate by alpha under any dependence between the
tests (positions of one run are nested events, hence correlated). A test only
counts as drift when it is significant *and* the difference is at least the
scenario's minimum effect size.

Mean acceptance length (1 + accepted / drafts) is compared through the
per-draft number of accepted tokens, whose distribution the per-position
counts determine exactly: #drafts with exactly j accepted =
c[j-1] - c[j] (c[-1] = drafts, c[K] = 0). The test is the delta-method
(Welch) z-test on the difference of means; a seeded bootstrap that resamples
drafts gives a second interval for the reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from parity.analysis.metrics import wilson_interval

Z95 = 1.959964
MIN_EXPECTED = 5          # Fisher's exact test below this expected cell count
MIN_DRAFTS_FOR_LENGTH = 30  # the normal approximation of the mean length needs this many drafts a side

__all__ = ["wilson_interval", "two_proportion_z", "fisher_exact", "proportion_test", "holm", "bonferroni",
           "accepted_histogram", "LengthDifference", "mean_length_difference", "bootstrap_length_interval"]


def two_proportion_z(x1: int, n1: int, x2: int, n2: int) -> float:
    """Two-sided p-value of the pooled two-proportion z-test (1.0 when either sample is empty)."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    pooled = (x1 + x2) / (n1 + n2)
    var = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if var <= 0:   # both proportions are 0 or both are 1: identical
        return 1.0
    z = (x1 / n1 - x2 / n2) / math.sqrt(var)
    return math.erfc(abs(z) / math.sqrt(2))


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_exact(x1: int, n1: int, x2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test on [[x1, n1-x1], [x2, n2-x2]].

    The p-value sums the hypergeometric probabilities of every table with the
    same margins that is no more probable than the observed one (the
    convention of R's fisher.test and scipy.stats.fisher_exact).
    """
    if n1 <= 0 or n2 <= 0:
        return 1.0
    total, successes = n1 + n2, x1 + x2
    denom = _log_choose(total, successes)
    lo, hi = max(0, successes - n2), min(n1, successes)

    def logp(a: int) -> float:
        return _log_choose(n1, a) + _log_choose(n2, successes - a) - denom

    observed = logp(x1)
    p = sum(math.exp(lp) for lp in (logp(a) for a in range(lo, hi + 1)) if lp <= observed + 1e-7)
    return min(1.0, p)


def proportion_test(x1: int, n1: int, x2: int, n2: int, min_expected: float = MIN_EXPECTED) -> tuple[float, str]:
    """(p, method): Fisher's exact test when an expected cell count is below `min_expected`, else the z-test."""
    if n1 <= 0 or n2 <= 0:
        return 1.0, "none"
    total, successes = n1 + n2, x1 + x2
    expected = [n * s / total for n in (n1, n2) for s in (successes, total - successes)]
    if min(expected) < min_expected:
        return fisher_exact(x1, n1, x2, n2), "fisher"
    return two_proportion_z(x1, n1, x2, n2), "z"


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input's order (reject where adjusted p <= alpha)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def bonferroni(pvalues: Sequence[float]) -> list[float]:
    """Bonferroni adjusted p-values: min(1, m * p)."""
    m = len(pvalues)
    return [min(1.0, m * p) for p in pvalues]


def accepted_histogram(num_drafts: int, accepted_per_position: Sequence[int]) -> list[int]:
    """Drafts with exactly 0..K accepted tokens, from vLLM's per-position counts.

    Raises ValueError when the counts are not non-increasing within 0..num_drafts
    (they cannot come from drafts then).
    """
    counts = [num_drafts, *accepted_per_position, 0]
    if any(c < 0 for c in counts) or any(a < b for a, b in zip(counts, counts[1:])):
        raise ValueError(f"per-position counts {list(accepted_per_position)} are not non-increasing "
                         f"within 0..{num_drafts} drafts")
    return [counts[j] - counts[j + 1] for j in range(len(accepted_per_position) + 1)]


def _moments(num_drafts: int, accepted_per_position: Sequence[int]) -> tuple[float, float]:
    """Mean and sample variance of the number of accepted tokens per draft."""
    hist = accepted_histogram(num_drafts, accepted_per_position)
    mean = sum(j * h for j, h in enumerate(hist)) / num_drafts
    if num_drafts < 2:
        return mean, 0.0
    ss = sum(h * (j - mean) ** 2 for j, h in enumerate(hist))
    return mean, ss / (num_drafts - 1)


@dataclass(frozen=True)
class LengthDifference:
    """Mean acceptance length of `other` minus the reference's, with its uncertainty."""

    reference: float
    other: float
    diff: float
    se: float
    ci95: tuple[float, float]      # delta-method (normal) interval of the difference
    p: float                       # two-sided, delta-method z-test
    enough_drafts: bool            # both sides have MIN_DRAFTS_FOR_LENGTH drafts (the test is valid)


def mean_length_difference(n_ref: int, counts_ref: Sequence[int], n: int, counts: Sequence[int]) -> LengthDifference:
    """Compare mean acceptance lengths (1 + mean accepted per draft) with the delta method."""
    if n_ref <= 0 or n <= 0:
        raise ValueError("mean acceptance length needs at least one draft on each side")
    m_ref, v_ref = _moments(n_ref, counts_ref)
    m, v = _moments(n, counts)
    diff = m - m_ref
    se = math.sqrt(v_ref / n_ref + v / n)
    if se == 0:
        p = 1.0 if diff == 0 else 0.0
    else:
        p = math.erfc(abs(diff / se) / math.sqrt(2))
    ci = (diff - Z95 * se, diff + Z95 * se)
    enough = min(n_ref, n) >= MIN_DRAFTS_FOR_LENGTH
    return LengthDifference(1 + m_ref, 1 + m, diff, se, ci, p, enough)


def bootstrap_length_interval(n_ref: int, counts_ref: Sequence[int], n: int, counts: Sequence[int],
                              seed: int = 0, resamples: int = 4000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean-length difference (other - reference).

    Each resample draws every run's drafts with replacement (a multinomial over
    the per-draft accepted counts); `seed` makes it reproducible.
    """
    rng = np.random.default_rng(seed)
    diffs = np.zeros(resamples)
    for sign, drafts, per_pos in ((-1.0, n_ref, counts_ref), (1.0, n, counts)):
        # A multinomial resample of the drafts, drawn as a chain of conditional binomials
        # (vectorised over resamples): #drafts with > i accepted among those with > i-1.
        above = np.full(resamples, drafts, dtype=np.int64)
        total = np.zeros(resamples)
        previous = drafts
        for c in per_pos:
            share = c / previous if previous else 0.0
            above = rng.binomial(above, share)
            total += above
            previous = c
        diffs += sign * total / drafts
    tail = (1 - level) / 2
    lo, hi = np.quantile(diffs, [tail, 1 - tail])
    return float(lo), float(hi)


@dataclass
class PositionTest:
    """One per-position comparison: counts, rates, Wilson intervals, raw and adjusted p."""

    position: int
    ref_accepted: int
    ref_drafts: int
    accepted: int
    drafts: int
    p: float
    method: str                    # "z", "fisher" or "none"
    p_adjusted: float | None = None
    drift: bool = False

    @property
    def ref_rate(self) -> float:
        return self.ref_accepted / self.ref_drafts if self.ref_drafts else 0.0

    @property
    def rate(self) -> float:
        return self.accepted / self.drafts if self.drafts else 0.0

    @property
    def delta(self) -> float:
        return self.rate - self.ref_rate

    @property
    def ref_ci(self) -> tuple[float, float]:
        return wilson_interval(self.ref_accepted, self.ref_drafts)

    @property
    def ci(self) -> tuple[float, float]:
        return wilson_interval(self.accepted, self.drafts)


def position_tests(ref_drafts: int, ref_counts: Sequence[int], drafts: int,
                   counts: Sequence[int]) -> list[PositionTest]:
    """Raw (uncorrected) tests of every position of one run against a reference run."""
    if len(ref_counts) != len(counts):
        raise ValueError(f"runs have different K: {len(ref_counts)} vs {len(counts)} positions")
    tests = []
    for i, (x_ref, x) in enumerate(zip(ref_counts, counts)):
        p, method = proportion_test(int(x_ref), ref_drafts, int(x), drafts)
        tests.append(PositionTest(i, int(x_ref), ref_drafts, int(x), drafts, p, method))
    return tests


def adjust(pvalues: Sequence[float], correction: str = "holm") -> list[float]:
    """Adjusted p-values by `correction` ("holm" or "bonferroni")."""
    if correction == "holm":
        return holm(pvalues)
    if correction == "bonferroni":
        return bonferroni(pvalues)
    raise ValueError(f"unknown correction {correction!r}")


def is_drift(p_adjusted: float, delta: float, alpha: float, min_effect: float) -> bool:
    """Significant after correction and at least the minimum effect size."""
    return p_adjusted <= alpha and abs(delta) >= min_effect


def position_message(t: PositionTest, reference: str, alpha: float) -> str:
    """One line with both rates, counts, Wilson 95% intervals, the p-values and the test used."""
    lo, hi = t.ci
    rlo, rhi = t.ref_ci
    adj = f", adjusted p={t.p_adjusted:.2g}" if t.p_adjusted is not None else ""
    return (f"position {t.position}: acceptance {t.rate:.3f} ({t.accepted}/{t.drafts}, 95% CI {lo:.2f}-{hi:.2f}) "
            f"vs {reference} {t.ref_rate:.3f} ({t.ref_accepted}/{t.ref_drafts}, 95% CI {rlo:.2f}-{rhi:.2f}), "
            f"Δ {t.delta:+.3f}, p={t.p:.2g} ({t.method}){adj}, alpha {alpha:g}")
