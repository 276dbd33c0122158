"""The padding contract over a hybrid target's state slots (`state_slots`): what the probe poisons and reads.

- poisoned: the committed and provisional states of every slot no live row of
  the forward holds, the sentinel included (region "state"): a live row must
  never read them, whatever padded rows wrote there; and the provisional
  states of the slots the live rows hold (region "unwritten"): the forward
  must overwrite every one of them, so no poison may survive it.
- the tails of the state-index buffers hold the sentinel under both poisons
  (its state differs between them), so reading past the padded rows shows;
- read: the live rows' provisional states, per recurrent layer, bit for bit.
Live rows' slots come from the slot holder by request id, not from the index
buffers the forward reads (a bug may have moved those).
"""

from __future__ import annotations

import torch

STATE_KINDS = ("state", "unwritten")
STATE_INDEXES = ("state_index", "spec_index")     # `state_slots.STATE_FIELDS`
STATE_POISON = {"A": 0.375, "B": -1.25}


def live_slots(owner, dispatch) -> list[int]:
    """The slots the live rows' requests hold."""
    req_ids = owner.buffers["req_ids"][: dispatch.num_reqs].tolist()
    return owner.state_slots.slots_of(req_ids)


def poison_state(owner, dispatch, kind: str, pattern: str) -> None:
    slots = owner.state_slots
    value = STATE_POISON[pattern]
    device = owner.buffers.device
    if kind == "state":
        for slot in slots.free_slots():       # each slot its own value: which one a live row reads shows
            for tensor in slots.tensors():
                tensor[slot] = value * (1 + slot / 8)
        return
    index = torch.tensor(live_slots(owner, dispatch), dtype=torch.int64, device=device)
    for tensor in slots.spec.values():
        tensor.index_fill_(0, index, value)


def sentinel_tail(owner, name: str, tensor: torch.Tensor, holes: slice, pattern: str) -> bool:
    """A state-index buffer's tail points at poisoned slots: the sentinel under poison A, the lowest free slot
    (else the sentinel) under B. Every such slot holds its own value under each poison (`poison_state`), so a
    live row reading the tail reads another state under each, and B in the tail alone names the buffer.
    False (nothing done) for every other buffer."""
    slots = getattr(owner, "state_slots", None)
    if slots is None or name not in STATE_INDEXES:
        return False
    tensor[holes] = slots.sentinel if pattern == "A" else slots.free_slots()[0]
    return True


def state_outputs(owner, dispatch) -> dict[str, torch.Tensor]:
    """The live rows' provisional states after a forward, per recurrent layer."""
    slots = getattr(owner, "state_slots", None)
    if slots is None:
        return {}
    index = torch.tensor(live_slots(owner, dispatch), dtype=torch.int64, device=owner.buffers.device)
    return {f"spec_state[{layer}] live slots": spec.index_select(0, index) for layer, spec in slots.spec.items()}


def saved_state(owner) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, copy) of every state slot tensor, for a probe's pre-state."""
    slots = getattr(owner, "state_slots", None)
    return [(t, t.clone()) for t in slots.tensors()] if slots is not None else []


def slot_evidence(owner, dispatch, names) -> list[str]:
    """For state-index buffers among `names`: which slots their padded rows name, and who holds them."""
    slots = getattr(owner, "state_slots", None)
    if slots is None:
        return []
    lines = []
    for name in names:
        if name not in STATE_INDEXES:
            continue
        spec = owner.buffers.spec(name)
        padded = owner.buffers[name][spec.padded(dispatch)].tolist()
        for slot in sorted(set(padded) - {slots.sentinel}):
            holder = slots.owner_of(slot)
            who = f"held by request {holder}" if holder is not None else "held by no request"
            lines.append(f"padded rows of {name} name state slot {slot} ({who}), not the sentinel slot "
                         f"{slots.sentinel}: their state writes land in it")
    return lines
