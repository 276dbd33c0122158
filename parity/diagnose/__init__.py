"""Bisection: from "this mode differs from its padded reference" to the buffer and bug class.

The lockstep (`bisector.py`) finds the first forward whose outputs differ by a
single bit, or a run-level fault (a shared pool, `pool.py`; outputs read too
late, `lifetime.py`; a capture that fails, `capture_error.py`); the divergent
forward is handed to the stages as one object (`lab.py`, `Divergence`), each
`stage(lab) -> Diagnosis | None`, tried in the order of
`bisector.GRAPH_STAGES` (`padding.stage` for the reference on poisoned
padding). docs/architecture.md says what each stage does. The bisector sees
only engines and their graphs: it never reads which bugs were switched on.
"""

from parity.diagnose.bisector import Bisector, bisect_mode
from parity.diagnosis.record import Diagnosis

__all__ = ["Bisector", "Diagnosis", "bisect_mode"]
