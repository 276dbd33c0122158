"""parity.analysis.stats: known values, the false-alarm rate under the null, power against seed 000."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parity.analysis import stats
from parity.analysis.gate import Pairing, evaluate_gate
from parity.analysis.metrics import Acceptance
from parity.analysis.sources import from_acceptance
from parity.analysis.tolerances import Tolerances

# Seed 000 (vLLM #20190): printed per-position acceptance, PIECEWISE then FULL.
PIECEWISE = (0.77, 0.51, 0.28, 0.13, 0.05, 0.03, 0.03)
FULL = (0.63, 0.28, 0.11, 0.05, 0.02, 0.00, 0.00)
# The default scenario's eager profile (72/113, 45/113, 27/113).
DEFAULT = (0.637, 0.398, 0.239)


# --- known values -----------------------------------------------------------------------------------

def test_two_proportion_z_known_value():
    # pooled 0.70, se sqrt(0.21 * 0.02) = 0.0648, z = 2.160
    assert stats.two_proportion_z(77, 100, 63, 100) == pytest.approx(0.030754, abs=1e-5)
    assert stats.two_proportion_z(5, 10, 5, 10) == 1.0
    assert stats.two_proportion_z(0, 10, 0, 20) == 1.0          # both zero: identical
    assert stats.two_proportion_z(3, 0, 1, 5) == 1.0            # empty sample: no information


def test_fisher_exact_known_values():
    # scipy.stats.fisher_exact([[8, 2], [1, 5]]) and R's fisher.test give 0.034965
    assert stats.fisher_exact(8, 10, 1, 6) == pytest.approx(0.0349650, abs=1e-6)
    assert stats.fisher_exact(3, 10, 7, 10) == pytest.approx(0.1788954, abs=1e-6)
    assert stats.fisher_exact(0, 5, 5, 5) == pytest.approx(0.0079365, abs=1e-6)
    assert stats.fisher_exact(4, 8, 4, 8) == pytest.approx(1.0)
    assert stats.fisher_exact(8, 10, 1, 6) == pytest.approx(stats.fisher_exact(1, 6, 8, 10))


def test_proportion_test_picks_fisher_for_small_counts():
    assert stats.proportion_test(2, 8, 6, 9)[1] == "fisher"
    assert stats.proportion_test(72, 113, 71, 114)[1] == "z"


def test_holm_and_bonferroni_known_values():
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.bonferroni([0.01, 0.3]) == pytest.approx([0.02, 0.6])
    assert stats.holm([]) == []


def test_wilson_interval_known_value():
    lo, hi = stats.wilson_interval(72, 113)
    assert (lo, hi) == pytest.approx((0.545359, 0.719957), abs=1e-6)
    assert stats.wilson_interval(0, 0) == (0.0, 0.0)


def test_accepted_histogram_and_validation():
    assert stats.accepted_histogram(10, [6, 3, 1]) == [4, 3, 2, 1]
    with pytest.raises(ValueError):
        stats.accepted_histogram(10, [3, 6, 1])       # not nested
    with pytest.raises(ValueError):
        stats.accepted_histogram(5, [6, 3, 1])        # more than drafts


def test_mean_length_difference_known_value():
    # seed 000 at 100 drafts a side: 2.80 vs 2.09 (counts from the rounded rates)
    d = stats.mean_length_difference(100, [77, 51, 28, 13, 5, 3, 3], 100, [63, 28, 11, 5, 2, 0, 0])
    assert (d.reference, d.other, d.diff) == pytest.approx((2.80, 2.09, -0.71))
    # variances 2.5657 and 1.3716 (sample) -> se sqrt(0.039373) = 0.19843
    assert d.se == pytest.approx(0.19843, abs=1e-4)
    assert d.p == pytest.approx(math.erfc(0.71 / d.se / math.sqrt(2)))
    same = stats.mean_length_difference(50, [30, 10], 50, [30, 10])
    assert same.diff == 0 and same.p == 1.0


def test_bootstrap_interval_is_seeded_and_agrees_with_the_delta_method():
    args = (100, [77, 51, 28, 13, 5, 3, 3], 100, [63, 28, 11, 5, 2, 0, 0])
    a = stats.bootstrap_length_interval(*args, seed=3)
    assert a == stats.bootstrap_length_interval(*args, seed=3)
    d = stats.mean_length_difference(*args)
    assert a[0] == pytest.approx(d.ci95[0], abs=0.05) and a[1] == pytest.approx(d.ci95[1], abs=0.05)


# --- simulation ---------------------------------------------------------------------------------------

def simulate(rates, drafts: int, rng: np.random.Generator) -> Acceptance:
    """Per-position counts of `drafts` drafts whose accepted length follows the nested rates."""
    p = np.array([1.0, *rates]) - np.array([*rates, 0.0])      # P(exactly j accepted)
    hist = rng.multinomial(drafts, p)
    counts = tuple(int(hist[j + 1:].sum()) for j in range(len(rates)))
    return Acceptance(drafts, counts)


def gate_drifts(ref: Acceptance, other: Acceptance, tol: Tolerances) -> list:
    pairing = Pairing(from_acceptance("full", "engine", other), from_acceptance("eager", "engine", ref), "eager")
    return [c for c in evaluate_gate([pairing], tol).checks if not c.passed]


@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_false_alarm_rate_under_the_null_is_at_most_alpha(alpha):
    """Same acceptance profile on both sides: the gate's family-wise false-alarm rate stays <= alpha."""
    rng = np.random.default_rng(20190)
    sims = 4000
    tol = Tolerances(alpha=alpha, acceptance_min_effect=0.0)     # the test alone, no effect-size floor
    alarms = sum(bool(gate_drifts(simulate(DEFAULT, 113, rng), simulate(DEFAULT, 113, rng), tol))
                 for _ in range(sims))
    rate = alarms / sims
    print(f"false-alarm rate at alpha {alpha}: {rate:.4f} ({alarms}/{sims})")
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / sims)


def test_single_z_test_is_calibrated():
    rng = np.random.default_rng(7)
    x1, x2 = rng.binomial(200, 0.4, size=4000), rng.binomial(200, 0.4, size=4000)
    rejections = np.mean([stats.two_proportion_z(a, 200, b, 200) <= 0.05 for a, b in zip(x1, x2)])
    assert 0.035 <= rejections <= 0.065


def test_power_against_the_seed_000_drop():
    """PIECEWISE 2.82 vs FULL 2.08: most of the time at ~100 drafts a side, almost always at 300."""
    rng = np.random.default_rng(0)
    tol = Tolerances()      # alpha 0.01, minimum effect 0.05
    power = {}
    for drafts in (100, 300):
        sims = 300
        fired = sum(bool(gate_drifts(simulate(PIECEWISE, drafts, rng), simulate(FULL, drafts, rng), tol))
                    for _ in range(sims))
        power[drafts] = fired / sims
    print(f"power against seed 000: {power}")
    assert power[100] >= 0.6      # measured 0.73: two-sided, alpha 0.01 family-wise over 8 tests
    assert power[300] >= 0.98     # measured 0.997


def test_minimum_effect_keeps_significant_but_small_differences_passing():
    ref, other = Acceptance(40000, (24000, 12000)), Acceptance(40000, (23200, 12000))   # 0.600 vs 0.580
    assert stats.two_proportion_z(24000, 40000, 23200, 40000) < 1e-6
    assert not gate_drifts(ref, other, Tolerances())
