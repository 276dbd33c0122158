"""The overlapped step loop (a scenario's `overlap: true`): staging, copy stream, results one step late.

The same engine step as `spec_decode` (it reuses its scheduler, sampler, drafter
and records), run the way an engine with async scheduling runs it:
- every host-built input reaches the device through pinned host slots and
  non-blocking copies on a copy stream, waited on by the compute stream with
  events (`staging.Stager`), never by the host;
- the host builds the draft decode steps' batch while the draft prefill's copies
  are still in flight, and issues its copies once the prefill has read the rows;
- a step's records are completed one step late: the verify logits are copied out
  into a slot of their own on a readback stream, and the next step's verify waits
  for that copy before it rewrites the rows (the "rows may be reused" event);
- the host waits only on the events whose results it consumes (the verify output
  it samples from, the drafts it verifies next, the readback it records).

Correct, it gives bit for bit the tokens and records of the synchronous loop.
Tree drafts are not overlapped (a clear error).
"""

from __future__ import annotations

import torch

from parity.engine import sampling
from parity.engine.metadata import RowPlan
from parity.engine.parts import EngineParts
from parity.engine.spec_decode import SpecDecodeEngine
from parity.engine.staging import staged
from parity.errors import ParityInputError

LOGITS = "target.logits"


class DeferredRecords:
    """Records whose steps are completed one step late, from a readback waited on its event."""

    def defer(self, entries, host_logits: torch.Tensor, event) -> None:
        self._late = (entries, host_logits, event)

    def complete(self) -> None:
        late, self._late = getattr(self, "_late", None), None
        if late is not None:
            entries, host_logits, event = late
            event.synchronize()          # the consumer's event: the readback has landed
            self.read_logits(entries, host_logits)

    def frames(self):
        self.complete()
        return super().frames()


class OverlapEngine(SpecDecodeEngine):
    def __init__(self, target, head, config, device="cpu", parts: EngineParts = EngineParts(),
                 sync: dict[str, str] | None = None):
        if config.tree and config.spec_decode:
            raise ParityInputError("overlap: true does not run tree drafts (topk > 1): set topk 1 or overlap false")
        records = parts.records
        parts = parts.replace(records=type(f"Deferred{records.__name__}", (DeferredRecords, records), {}))
        super().__init__(target, head, config, device, parts)
        self.stager = parts.stager(self.device, sync)
        for owner in self.owners():
            staged(owner.builder, self.stager, owner.name)
        self.G = self.stager.G

    def events(self, specs, progress=None):
        self.stager.active = True
        try:
            return (yield from super().events(specs, progress))
        finally:
            self.stager.active = False

    def _wait_compute(self) -> None:
        """The host waits for the compute stream's work so far (the consumer's event of an output it reads)."""
        done = self.G.Event()
        done.record(self.G.current_stream(self.device))
        done.synchronize()

    def _step(self, step, rows, records):
        k, target, stager = self.k, self.target, self.stager
        plans = [RowPlan(r.request.req_id, r.query, r.first_position, r.request.blocks) for r in rows]
        starts, dispatch, meta = self._verify_batch(rows, plans)
        stager.flush()
        stager.before_overwrite(LOGITS)      # the last step's logits rows are read back before this verify
        stager.consume("verify")
        logits, features = yield from self._forward(step, target, dispatch, meta, None, records, len(rows))
        records.complete()                   # the last step's records, one step late
        host_logits, read = stager.readback(LOGITS, logits[: starts[-1]], "verify")
        for row in rows:
            if row.is_prefill:
                row.request.num_computed = row.chunk_end
        self._wait_compute()
        emitted = sampling.emit(rows, plans, starts, logits, self.config, k)
        verified = [(list(r.request.drafts), list(r.request.draft_logprobs), list(r.request.draft_gaps))
                    for r in rows]
        yield from self._draft_and_end(step, rows, plans, starts, emitted, features, records, logits)
        records.defer(records.step_entries(step, rows, starts, emitted, verified, k), host_logits, read)
        self._finish(rows)

    def _draft(self, step, rows, plans, starts, emitted, features, records):
        """Draft prefill, with the draft decode steps' batch built on the host while its copies are in flight."""
        proposer, stager = self.proposer, self.stager
        dispatch, meta = proposer.prepare_prefill(rows, plans, starts, emitted, features)
        stager.flush()
        for i, row in enumerate(rows):      # the new sequence's positions from here on
            row.request.tokens.extend(emitted[i][0])
        drafting = [row for row in rows if not row.partial]
        n = len(drafting)
        ahead = self._build_steps(drafting) if n and self.k > 1 else None
        stager.consume("draft_prefill")
        yield from self._forward(step, proposer, dispatch, meta, 0, records, len(rows))
        if n == 0:
            return
        if ahead is not None:
            steps, step_meta = ahead
            stager.flush()                   # after the prefill read the rows these copies rewrite
            proposer.buffers["draft_step"].fill_(1)
            step_meta.draft_step = 1
            stager.consume("draft_step")
            for j in range(1, self.k):
                if j > 1:
                    proposer.advance(step_meta, steps)
                yield from self._forward(step, proposer, steps, step_meta, j, records, n)
        self._wait_compute()
        for row, (tokens, logprobs, gaps, probs) in zip(drafting, proposer.read_drafts(n)):
            req = row.request
            req.drafts, req.draft_logprobs, req.draft_gaps, req.draft_probs = tokens, logprobs, gaps, probs

    def _build_steps(self, rows):
        """The draft decode steps' dispatch and metadata (`EagleProposer.prepare_steps` without its device
        writes, which wait for the prefill)."""
        proposer, n = self.proposer, len(rows)
        plans = [RowPlan(r.request.req_id, [0], len(r.request.tokens) - 1, r.request.blocks) for r in rows]
        d = proposer.executor.dispatch("draft_step", n, n, True)
        return d, proposer.builder.build(plans, d.num_tokens_padded, d.num_reqs_padded, write_input_ids=False)
