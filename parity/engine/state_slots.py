"""Per-request recurrent state of a hybrid target: slots, their index metadata, commit and rollback.

A hybrid target's recurrent layers (`parity/models/recurrent.py`) keep, per
layer, two persistent tensors the way engines do for Mamba / Gated DeltaNet:

- `state`  [num_slots + 1, H, dk, dv]: each running request's committed state;
- `spec`   [num_slots + 1, L, H, dk, dv], L = 1 + K: the provisional states a
  verify forward writes, one per draft position.

The last slot is the sentinel (null slot): padded and dummy rows read and
write it, and no live row ever reads it. A request takes the lowest free slot
when it is first scheduled (its state zeroed) and gives it back when it
finishes. Which slot each row reads and writes is attention-like metadata in
two persistent ROW buffers with a padding contract (INERT, pad = the
sentinel): `state_index` (the committed state a row starts from) and
`spec_index` (where the row's provisional states go). After sampling the
engine commits, per row, the state after its last kept token (`settle`):
the accepted drafts' position for a decode row, the last token for a prefill
chunk; the rejected positions' states are dropped (rolled back).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine.buffers import INERT, ROW, InputBuffers
from parity.engine.metadata import AttentionMetadata, MetadataBuilder
from parity.errors import ParityInputError

STATE_FIELDS = ("state_index", "spec_index")


class StateSlots:
    """The committed and provisional states of every recurrent layer, and which request holds which slot."""

    def __init__(self, mixers: dict[int, tuple[int, int, int]], num_slots: int, positions: int,
                 device: torch.device):
        self.sentinel = num_slots
        self.positions = positions
        f32 = torch.float32
        self.state = {i: torch.zeros((num_slots + 1, h, dk, dv), dtype=f32, device=device)
                      for i, (h, dk, dv) in mixers.items()}
        self.spec = {i: torch.zeros((num_slots + 1, positions, h, dk, dv), dtype=f32, device=device)
                     for i, (h, dk, dv) in mixers.items()}
        self.held: dict[int, int] = {}          # req_id -> slot
        self._free = list(range(num_slots))

    def tensors(self) -> list[torch.Tensor]:
        return list(self.state.values()) + list(self.spec.values())

    def slot_for(self, req_id: int) -> int:
        """The slot `req_id` holds; a request seen for the first time takes the lowest free one, zeroed."""
        if req_id not in self.held:
            if not self._free:
                raise RuntimeError("out of recurrent state slots")
            slot = self._free.pop(0)
            for tensor in self.state.values():
                tensor[slot].zero_()
            self.held[req_id] = slot
        return self.held[req_id]

    def owner_of(self, slot: int) -> int | None:
        """The request holding `slot`, or None (free, or the sentinel)."""
        return next((req for req, held in self.held.items() if held == slot), None)

    def free_slots(self) -> list[int]:
        """The slots no request holds, and the sentinel."""
        return sorted(self._free) + [self.sentinel]

    def slots_of(self, req_ids: list[int]) -> list[int]:
        return [self.held[r] for r in req_ids if r in self.held]

    def commit(self, slots: list[int], positions: list[int]) -> None:
        """Each slot's provisional state at its position becomes its committed state."""
        if not slots:
            return
        device = next(iter(self.state.values())).device
        index = torch.tensor(slots, dtype=torch.int64, device=device)
        at = torch.tensor(positions, dtype=torch.int64, device=device)
        for layer, state in self.state.items():
            state.index_copy_(0, index, self.spec[layer][index, at])

    def settle(self, rows, plans, emitted) -> None:
        """After a step: commit each row's state after its last kept token, and free finished requests' slots."""
        slots, positions = [], []
        for row, plan, (_, accepted) in zip(rows, plans, emitted):
            kept = plan.query_len - 1 if row.is_prefill else accepted
            slots.append(self.held[plan.req_id])
            positions.append(self.positions - plan.query_len + kept)
        self.commit(slots, positions)
        for row in rows:
            if row.request.finished and row.request.req_id in self.held:
                self._free.append(self.held.pop(row.request.req_id))
        self._free.sort()


@dataclass
class HybridMetadata(AttentionMetadata):
    """Attention metadata plus the recurrent layers': the slots each row reads and writes, and the states."""

    state_index: torch.Tensor | None = None    # [num_reqs_padded]
    spec_index: torch.Tensor | None = None     # [num_reqs_padded]
    states: StateSlots | None = None


class StateIndexSteps:
    """The state-index steps a hybrid target's builder adds to any `MetadataBuilder` (mixed in before it)."""

    metadata_class = HybridMetadata
    slots: StateSlots | None = None

    def build(self, rows, num_tokens_padded, num_reqs_padded, input_ids=None, write_input_ids=True):
        meta = super().build(rows, num_tokens_padded, num_reqs_padded, input_ids, write_input_ids)
        if self.slots is not None:
            self.write_state(rows, sum(r.query_len for r in rows), num_tokens_padded, num_reqs_padded)
        return meta

    def write_state(self, rows, num_tokens: int, num_tokens_padded: int, num_reqs_padded: int) -> None:
        """Each row's slot into `state_index` and `spec_index`, padded rows at the sentinel."""
        slots = [self.slots.slot_for(r.req_id) for r in rows]
        _, pad = self.padding(num_tokens, num_tokens_padded, len(rows), num_reqs_padded)
        for name in STATE_FIELDS:
            self.write(name, slots, pad, num_tokens)

    def state_view(self, name: str, num_reqs_padded: int) -> torch.Tensor:
        """The entries of `name` a forward of `num_reqs_padded` rows reads."""
        return self.buffers[name][:num_reqs_padded]

    def make_view(self, num_tokens_padded, num_reqs_padded, *args):
        meta = super().make_view(num_tokens_padded, num_reqs_padded, *args)
        if self.slots is None:
            return meta
        for name in STATE_FIELDS:
            setattr(meta, name, self.state_view(name, num_reqs_padded))
        meta.states = self.slots
        return meta

    def build_dummy(self, num_tokens_padded: int, num_reqs_padded: int):
        for name in STATE_FIELDS if self.slots is not None else ():
            self.write(name, [], num_reqs_padded, 0)
        return super().build_dummy(num_tokens_padded, num_reqs_padded)


class StateBuilder(StateIndexSteps, MetadataBuilder):
    """The builder of a hybrid target (a variant of one state step subclasses `StateIndexSteps`)."""


def mixers_of(model) -> dict[int, tuple[int, int, int]]:
    """{layer id: (heads, key dim, value dim)} of the model's recurrent mixers (those with a `mix`)."""
    found = {}
    for layer in model.decoder_layers():
        mixer = layer.self_attn
        if hasattr(mixer, "mix"):
            found[mixer.layer_idx] = (mixer.heads, mixer.key_dim, mixer.value_dim)
    return found


def builder_class(model, base: type[MetadataBuilder]) -> type[MetadataBuilder]:
    """`base` for an attention-only target; for a hybrid one, `base` with the state-index steps (a variant's
    subclass of `StateIndexSteps` already has them; on an attention-only target they do nothing)."""
    if not mixers_of(model) or issubclass(base, StateIndexSteps):
        return base
    return type(f"State{base.__name__}", (StateIndexSteps, base), {})


def attach(runner, config, device: torch.device) -> StateSlots | None:
    """A hybrid target's state slots and state-index buffers on its runner; None for an attention-only one."""
    mixers = mixers_of(runner.model)
    if not mixers:
        return None
    if config.tree:
        raise ParityInputError("a hybrid (recurrent-state) target verifies chains only: tree drafts (topk > 1) "
                               "would need a state per branch")
    slots = StateSlots(mixers, config.max_num_seqs, config.num_speculative_tokens + 1, device)
    register_state_buffers(runner.buffers, config.max_num_seqs, slots.sentinel)
    runner.builder.slots = slots
    return slots


def register_state_buffers(buffers: InputBuffers, max_reqs: int, sentinel: int) -> None:
    for name in STATE_FIELDS:
        buffers.register(name, (max_reqs,), torch.int64, ROW, sentinel, INERT)
