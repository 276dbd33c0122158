"""Bisection: from "this mode differs from its padded reference" to the buffer and bug class.

1. Localise (`bisector.py`): drive the mode's strict padded reference (eager
   at the mode's padded shapes, its padding poisoned) and a graph engine of the
   same build in lockstep over the same schedule; the first forward whose
   outputs (everything it returns, every buffer it writes, the KV cache)
   differ by a single bit is the divergence. Target outputs are also re-checked
   at the end of every step, so a drafter replay that overwrites them (a shared
   pool) is caught (`pool.py`); records that differ after every forward matched
   are an output read too late (`lifetime.py`).
2. Hand the divergent forward to the stages as one object (`lab.py`,
   `Divergence`: both runs at the forward, their pre-states, what each
   produced, the graph it replayed). Each stage is `stage(lab) -> Diagnosis |
   None`; the first diagnosis stands, and each stage that isolates nothing adds
   what it tried to `lab.ruled_out`. In order:
   - `reproducible`: does the forward reproduce its own outputs at all?
   - `descriptor`: was the graph captured at the batch's padded shape?
   - `experiments`: repair one tensor the reference reads (`readset.py`) in the
     captured buffers and replay; delta-debug to the smallest set;
   - `rebound`: a piecewise attention output rebound; a metadata tensor that,
     pointed back at the persistent buffer, turns the reference into the graph;
   - `host_moves`: a host value the forward advances itself;
   - `recapture`: re-capture with one host value (or one buffer's capture-time
     contents) changed; otherwise UNEXPLAINED with the layer probes
     (`probes.py`) and everything ruled out. Never a guess.
   When graphs and reference agree throughout, the reference on clean padding
   against the reference on poisoned padding, and `padding.stage`.

The bisector sees only engines and their graphs: it never reads which bugs
were switched on when an engine was built.
"""

from parity.diagnose.bisector import Bisector, bisect_mode
from parity.diagnosis.record import Diagnosis

__all__ = ["Bisector", "Diagnosis", "bisect_mode"]
