"""How far a padded reference may depart from plain eager as padding numerics: a fixed bound.

The same maths at another padded shape rounds differently, so a reference's
logprobs may move against eager's. How far depends on the dtype and on the
computation, never on what a run happened to show: a bound derived from the
largest move observed grows with the error it should expose (a padding bug
shared by a graph and its reference moved logprobs by 1.25 and every flip
was called a near tie).

`bound(dtype, seam_scale)` = the dtype's calibrated padding-numerics bound
(`DTYPE_BOUNDS`, measured on clean engines, `docs/verdicts.md`) plus, under
the numerics test seam, 2 x its scale (the seam adds at most `scale` to every
logit in padded forwards, so a log-softmax moves by at most 2 x scale).
Same-context departures beyond the bound are a drift; a flip is a near tie
only when eager's own top-1 / top-2 margin there is within the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

# |Δ logprob| between a padded reference and plain eager on clean engines, with margin (docs/verdicts.md):
# float32 measured 2.4e-6 (tiny, CPU) and 2.0e-6 (tiny, H100); bfloat16 0 (tiny), 0.0157 (synthetic 1B) and
# 0.0313 (synthetic 8B) on an H100, every shipped scenario and graph mode; float16 not measured.
DTYPE_BOUNDS = {
    "float32": 0.01,
    "bfloat16": 0.25,
    "float16": 0.25,
}


@dataclass(frozen=True)
class Yardstick:
    dtype: str
    seam_scale: float = 0.0

    @property
    def dtype_bound(self) -> float:
        """The dtype's calibrated bound (an unmeasured dtype gets the largest)."""
        return DTYPE_BOUNDS.get(self.dtype, max(DTYPE_BOUNDS.values()))

    @property
    def bound(self) -> float:
        return self.dtype_bound + 2 * self.seam_scale

    def describe(self) -> str:
        seam = f" + 2 x the numerics seam's {self.seam_scale:g}" if self.seam_scale else ""
        return f"{self.bound:.3g} ({self.dtype}'s padding-numerics bound {self.dtype_bound:g}{seam})"
