"""Mutations of the overlapped loop's host staging (`engine/staging.py`): mixins over the Stager, one step each.

Each is a staging race of a public report: a buffer reused before the copy that
reads it completed. On CUDA the race is real (it shows under some timings); on the
emulated backend copies land as late as the program lets them (`graphs/streams.py`),
so each shows deterministically.
"""

from __future__ import annotations

COUNT = "target.seq_lens"


class RowsFreedBeforeReadback:
    """The "rows may be reused" event of the verify logits is recorded before the readback copy that still reads
    them (SGLang #37988): the next verify waits on it, replays, and rewrites the rows the readback has yet to read."""

    def readback(self, key, source, phase):
        early = self.G.Event()
        early.record(self.readback_stream)
        view, ready = super().readback(key, source, phase)
        self.free[key] = early
        return view, ready


class CountCopiedWithoutWait:
    """The per-request token count (the target's seq_lens) is copied on a stream of its own that the verify never
    waits on (vllm-ascend #9456): the forward reads the count of the batch before."""

    def issue(self, key, target, source, s):
        if key == COUNT:
            if getattr(self, "count_stream", None) is None:
                self.count_stream = self.G.Stream(device=self.device)
            s = self.count_stream
        super().issue(key, target, source, s)

    def wait_ready(self, keys):
        super().wait_ready([key for key in keys if key != COUNT])


class StagingRewrittenEarly:
    """The host rewrites a staging slot for the next batch without waiting for the copy that reads it: the draft
    decode steps' batch, built while the draft prefill's copies are in flight, lands in the prefill's rows."""

    def wait_reusable(self, key):
        return None
