"""Bisection: from "this mode differs from its padded reference" to the buffer and bug class.

1. Localise (`bisector.py`): drive the mode's strict padded reference (eager
   at the mode's padded shapes, its padding poisoned) and a graph engine of the
   same build in lockstep over the same schedule; the first forward whose
   outputs (everything it returns, every buffer it writes, the KV cache)
   differ by a single bit is the divergence. Target outputs are also re-checked at the end
   of every step, so a drafter replay that overwrites them (a shared pool) is
   caught (`pool.py`).
2. Audit that forward (`audit.py`): the graph's capture manifest against the
   live registry (another address: reassigned), the captured buffers against
   the values the reference forward used (same address, other values: stale),
   padded entries against inert values (padding leak).
3. Confirm causally (`audit.py`): repair suspects in the captured buffers and
   replay; delta-debug to the smallest set that restores bitwise parity. When
   no buffer explains it, re-capture under the live context (`recapture.py`):
   if that restores parity the graph baked something at capture, either whole
   metadata tensors (capture context) or Python values (frozen at capture),
   delta-debugged field by field.
4. Otherwise layer probes (`probes.py`), then UNEXPLAINED with the localisation
   found. Never a guess.

The bisector sees only engines and their graphs: it never reads which bugs
were switched on when an engine was built.
"""

from parity.diagnose.bisector import Bisector, bisect_mode
from parity.diagnosis.record import Diagnosis

__all__ = ["Bisector", "Diagnosis", "bisect_mode"]
