"""What the padding probe poisons and what it reads: regions of a padded forward, the pre-state it
restores, the contract's pad values, and a forward's live outputs compared bit for bit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from parity.engine.buffers import FREE, INERT, NUM_TOKENS, BufferSpec, InputBuffers, fill_like_live
from parity.engine.padding_state import STATE_INDEXES, saved_state, state_outputs
from parity.graphs.host_state import host_values, restore as restore_host


@dataclass
class Region:
    """One poisoned region: a buffer's padded entries or its tail, or the unowned KV slots."""

    buffer: str
    kind: str         # "padded" (FREE padded entries), "tail" (past the padded shape), "kv" (unowned slots)

    def label(self) -> str:
        return {"padded": f"{self.buffer} padded entries", "tail": f"{self.buffer} tail past the padded shape",
                "kv": "KV slots no live request owns",
                "inert": f"{self.buffer} padded entries (at their pad value) read for a live row",
                "state": "recurrent state slots no live row holds (the sentinel included)",
                "unwritten": "live rows' provisional state slots (the forward must overwrite them)"}[self.kind]


def regions(buffers: InputBuffers, dispatch) -> list[Region]:
    """Every region the probe poisons for a forward of `dispatch`."""
    found = []
    for name, tensor in buffers.items():
        spec = buffers.spec(name)
        if spec.padding not in (FREE, INERT):
            continue
        padded = spec.padded(dispatch)
        if spec.padding == FREE and padded.stop > padded.start:
            found.append(Region(name, "padded"))
        t = spec.tail(dispatch, tensor.shape[0])
        if t.stop > t.start:
            found.append(Region(name, "tail"))
    return found + [Region("kv_cache", "kv")]


def state_regions(owner) -> list[Region]:
    """The state regions (`padding_state`) of an owner with state slots: none for attention-only ones."""
    if getattr(owner, "state_slots", None) is None:
        return []
    return [Region("state_slots", "state"), Region("spec_state", "unwritten")]


def inert_regions(buffers: InputBuffers, dispatch) -> list[Region]:
    """INERT buffers whose padded entries can move to another well-formed value (`move_inert`)."""
    return [Region(name, "inert") for name, _ in buffers.items()
            if buffers.spec(name).padding == INERT and movable(buffers.spec(name), name)
            and buffers.spec(name).padded(dispatch).stop > buffers.spec(name).padded(dispatch).start]


def movable(spec, name: str = "") -> bool:
    """A PAD slot cannot move (any other value is a real slot), nor a state index's sentinel (another value
    is a live slot: padded rows would write it); row starts and lengths can."""
    return name not in STATE_INDEXES and (spec.pad == NUM_TOKENS or (isinstance(spec.pad, int) and spec.pad >= 0))


def move_inert(tensor: torch.Tensor, spec, dispatch, salt: int) -> None:
    """Padded entries off their pad value, still well formed: row starts to the padded token count (the padded
    rows then hold padded tokens only), other values copied from live entries."""
    holes = spec.padded(dispatch)
    if spec.pad == NUM_TOKENS:
        tensor[holes] = dispatch.num_tokens_padded
    else:
        fill_like_live(tensor, spec.used(dispatch.num_tokens, dispatch.num_reqs), holes, "A", salt)


class PreState:
    """What a probed forward may change, saved before it: every buffer, the KV rows its slots name, and the
    owner's host values (a counter the forward advances itself must start each re-run where it started)."""

    def __init__(self, owner, dispatch):
        self.owner, self.host = owner, host_values(owner)
        self.buffers = [(t, t.clone()) for _, t in owner.buffers.items()]
        caches = owner.kv_cache.tensors()
        slots = owner.buffers["slot_mapping"][: dispatch.num_tokens_padded]
        self.rows = slots.remainder(caches[0].shape[0]) if caches else None
        live = slots[: dispatch.num_tokens]
        self.live_rows = live[live >= 0]
        self.kv = [(c, c.index_select(0, self.rows)) for c in caches]
        self.buffers += saved_state(owner)

    def restore(self) -> None:
        for live, saved in self.buffers:
            live.copy_(saved)
        for cache, saved in self.kv:
            cache.index_copy_(0, self.rows, saved)
        restore_host(self.host, self.owner)


def off_contract(buffers: InputBuffers, dispatch) -> dict[str, tuple[int, int]]:
    """{name: (pad value, entries off it)} for every INERT buffer whose padded entries are not their pad value."""
    found = {}
    for name, tensor in buffers.items():
        spec = buffers.spec(name)
        region = spec.padded(dispatch)
        if spec.padding != INERT or region.stop <= region.start:
            continue
        value = spec.inert_value(dispatch.num_tokens)
        off = int((tensor[region] != value).sum())
        if off:
            found[name] = (value, off)
    return found


def restore_contract(buffers: InputBuffers, dispatch, names) -> None:
    """The padded entries of the INERT buffers `names` set to their pad value."""
    for name in names:
        tensor, spec = buffers[name], buffers.spec(name)
        region = spec.padded(dispatch)
        if spec.padding == INERT and region.stop > region.start:
            tensor[region] = spec.inert_value(dispatch.num_tokens)


def live_outputs(owner, dispatch, result, kv_rows) -> dict[str, torch.Tensor]:
    """Every live output of a forward: returned tensors' live rows, buffers' live entries, live KV rows."""
    out = {}
    forward = owner.forward(dispatch.phase)
    names = forward.outputs
    for i, tensor in enumerate(result if isinstance(result, tuple) else (result,)):
        if isinstance(tensor, torch.Tensor):
            out[names[i] if i < len(names) else f"output {i}"] = _live_rows(tensor, dispatch).clone()
    for name, index in forward.writes:
        live = BufferSpec(index).used(dispatch.num_tokens, dispatch.num_reqs)
        out[name] = owner.buffers[name][live].clone()
    for layer, cache in enumerate(owner.kv_cache.tensors()):
        out[f"kv_cache[{layer}] live slots"] = cache.index_select(0, kv_rows)
    return {**out, **state_outputs(owner, dispatch)}


def _live_rows(tensor: torch.Tensor, dispatch) -> torch.Tensor:
    if tensor.dim() and tensor.shape[0] == dispatch.num_tokens_padded:
        return tensor[: dispatch.num_tokens]
    if tensor.dim() and tensor.shape[0] == dispatch.num_reqs_padded:
        return tensor[: dispatch.num_reqs]
    return tensor


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bits as integers: equality is bitwise, NaN equals an identical NaN."""
    if t.is_floating_point():
        return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.int8}[t.element_size()])
    return t


def differing(a: dict, b: dict) -> list[str]:
    return [name for name in a if a[name].shape != b[name].shape or not torch.equal(bits(a[name]), bits(b[name]))]


def advance_origin(owner, dispatch, meta) -> tuple[list[str], list[str]]:
    """Does the builder's step advance keep padded rows at their registered pad values?

    On a copy of the forward's metadata with every INERT padded entry at its
    pad value, run the owner's `advance_draft_step`. Entries that leave their
    pad value show the contract is not a fixed point; then each INERT field
    alone is set to 0 (an empty row) before the advance, and a field that keeps
    every other entry at its pad is named: its registered pad value is what
    makes padded rows live. Returns (the fields named, the evidence).
    """
    advance = getattr(owner.builder, "advance_draft_step", None)
    inert = {n: owner.buffers.spec(n) for n in owner.buffers.names()
             if owner.buffers.spec(n).inert and isinstance(getattr(meta, n, None), torch.Tensor)}
    if advance is None or not inert:
        return [], []

    def advanced(empty: str | None) -> list[str]:
        copy = dataclasses.replace(meta, **{f.name: getattr(meta, f.name).clone() for f in dataclasses.fields(meta)
                                            if isinstance(getattr(meta, f.name), torch.Tensor)})
        for name, spec in inert.items():
            getattr(copy, name)[spec.padded(dispatch)] = 0 if name == empty else spec.inert_value(dispatch.num_tokens)
        advance(copy, dispatch.num_reqs_padded)
        return [n for n, spec in inert.items() if n != empty and
                bool((getattr(copy, n)[spec.padded(dispatch)] != spec.inert_value(dispatch.num_tokens)).any())]

    moved = advanced(None)
    if not moved:
        return [], ["the builder's step advance keeps padded rows at their registered pad values"]
    evidence = [f"advancing padded rows held at their registered pad values one draft step (the owner's builder, "
                f"on a copy) moves {', '.join(moved)} off the pad value"]
    fixes = [n for n, spec in inert.items() if spec.inert_value(dispatch.num_tokens) != 0 and not advanced(n)]
    for name in fixes:
        evidence.append(f"with {name} 0 (an empty row) instead of its registered pad value "
                        f"{inert[name].inert_value(dispatch.num_tokens)} every padded entry stays inert: "
                        f"the registered pad value of {name} makes padded rows live")
    return fixes, evidence


def padded_kv_writes(owner, dispatch, run, every, live_slots, block_size: int) -> int:
    """How many first-layer KV rows live requests own change with the poison.

    Owned: the live rows' context (written before this forward) and the
    slots the live tokens write now. A live token's first-layer key and
    value depend on its own inputs alone, so under either poison they are
    the same unless a padded token wrote over them."""
    b = owner.buffers
    n = dispatch.num_reqs
    starts, ends = b["query_start_loc"][:n], b["query_start_loc"][1: n + 1]
    context = (b["seq_lens"][:n] - (ends - starts)).clamp(min=0)     # positions written before this forward
    width = int(context.max()) if n else 0
    slots = live_slots
    if width:
        positions = torch.arange(width, device=b.device)
        blocks = b["block_table"][:n].gather(1, (positions // block_size).unsqueeze(0).expand(n, -1))
        before = (blocks * block_size + positions % block_size)[positions.unsqueeze(0) < context.unsqueeze(1)]
        slots = torch.cat([before, live_slots])
    if slots.numel() == 0:
        return 0
    layer0 = (owner.kv_cache.keys[0], owner.kv_cache.values[0])

    def owned(regions):
        run(regions)
        return [c.index_select(0, slots) for c in layer0]
    a, bb = owned([]), owned(every)
    changed = torch.zeros(slots.shape[0], dtype=torch.bool, device=slots.device)
    for x, y in zip(a, bb):
        changed |= (bits(x) != bits(y)).reshape(slots.shape[0], -1).any(dim=1)
    return int(changed.sum())
