"""Faults of hybrid (recurrent-state) targets (docs/hybrid.md): each overrides one state-index step of the
target's builder (`engine.state_slots.StateIndexSteps`), the way the public report's bug did it."""

from __future__ import annotations

from parity.engine.state_slots import STATE_FIELDS, StateIndexSteps


class PaddedStateRowsSlotZero(StateIndexSteps):
    """tokenspeed #700 / AReno #509: padded rows' state index is 0, a real slot, not the sentinel: padded
    rows write their (stale) state over the provisional states of the request holding slot 0."""

    def write_state(self, rows, num_tokens, num_tokens_padded, num_reqs_padded):
        slots = [self.slots.slot_for(r.req_id) for r in rows]
        _, pad = self.padding(num_tokens, num_tokens_padded, len(rows), num_reqs_padded)
        for name in STATE_FIELDS:
            self.write(name, slots + [0] * pad, 0, num_tokens)


class StateIndexFromTail(StateIndexSteps):
    """SGLang #32555: the state-index buffer is refilled at the front, but a padded batch reads the rows'
    committed states through a view of its tail (the last num_reqs_padded entries); an unpadded batch (eager)
    reads the front, so only graphs replaying a padded shape go wrong."""

    _live_rows = 0

    def make_view(self, num_tokens_padded, num_reqs_padded, num_reqs, *args):
        self._live_rows = num_reqs
        return super().make_view(num_tokens_padded, num_reqs_padded, num_reqs, *args)

    def state_view(self, name, num_reqs_padded):
        if name != "state_index" or num_reqs_padded == self._live_rows:
            return super().state_view(name, num_reqs_padded)
        buffer = self.buffers[name]
        return buffer[buffer.shape[0] - num_reqs_padded:]


class SpecStateIntoNullBlock(StateIndexSteps):
    """intel/llm-scaler #711: live rows' provisional (speculative) states are written into the shared null
    block (the sentinel slot) instead of their own slots; the commit then reads what their slots held before."""

    def write_state(self, rows, num_tokens, num_tokens_padded, num_reqs_padded):
        slots = [self.slots.slot_for(r.req_id) for r in rows]
        _, pad = self.padding(num_tokens, num_tokens_padded, len(rows), num_reqs_padded)
        self.write("state_index", slots, pad, num_tokens)
        self.write("spec_index", [self.slots.sentinel] * len(slots), pad, num_tokens)


class StatePaddedToTokenCount(StateIndexSteps):
    """vLLM #45100 / vllm-ascend #15461: the request-indexed state indices are padded from the token count
    instead of the row count: under a padded uniform-decode batch (FULL replay) the padded rows keep the slots
    an earlier, larger batch left there."""

    def write_state(self, rows, num_tokens, num_tokens_padded, num_reqs_padded):
        slots = [self.slots.slot_for(r.req_id) for r in rows]
        for name in STATE_FIELDS:
            self.write(name, slots, 0, num_tokens)
            if num_tokens < num_reqs_padded:
                self.buffers[name][num_tokens:num_reqs_padded] = self.slots.sentinel
