"""What the padding probe poisons and what it reads: regions of a padded forward, the pre-state it
restores, the contract's pad values, and a forward's live outputs compared bit for bit."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine.buffers import FREE, INERT, ROW, ROW_PLUS_ONE, TOKEN, BufferSpec, InputBuffers

@dataclass
class Region:
    """One poisoned region: a buffer's padded entries or its tail, or the unowned KV slots."""

    buffer: str
    kind: str         # "padded" (FREE padded entries), "tail" (past the padded shape), "kv" (unowned slots)

    def label(self) -> str:
        return {"padded": f"{self.buffer} padded entries", "tail": f"{self.buffer} tail past the padded shape",
                "kv": "KV slots no live request owns"}[self.kind]


def tail(spec, dispatch, length: int) -> slice:
    """The entries of a batch-indexed buffer past `dispatch`'s padded shape."""
    start = {TOKEN: dispatch.num_tokens_padded, ROW: dispatch.num_reqs_padded,
             ROW_PLUS_ONE: dispatch.num_reqs_padded + 1}.get(spec.index)
    return slice(length, length) if start is None else slice(min(start, length), length)


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
        t = tail(spec, dispatch, tensor.shape[0])
        if t.stop > t.start:
            found.append(Region(name, "tail"))
    return found + [Region("kv_cache", "kv")]


def fill_like_live(tensor: torch.Tensor, live: slice, holes: slice, pattern: str, salt: int) -> None:
    """Fill `tensor[holes]` with valid values derived from its live entries, in pattern A or B."""
    count, n = live.stop - live.start, holes.stop - holes.start
    if n <= 0:
        return
    if count <= 0:
        tensor[holes] = 0 if pattern == "A" else 1
        return
    idx = torch.arange(n, device=tensor.device)
    if pattern == "A":
        picks = (idx * 7 + salt) % count + live.start
        values = tensor[picks]
        tensor[holes] = values * -3.0 if tensor.is_floating_point() else values
        return
    picks = (count - 1 - (idx * 5 + salt) % count) + live.start
    values = tensor[picks]
    if tensor.is_floating_point():
        tensor[holes] = values * 2.5 + 0.5
    else:
        zero = (idx % 2 == 0).view(-1, *([1] * (values.dim() - 1)))
        tensor[holes] = torch.where(zero, torch.zeros_like(values), values)


class PreState:
    """What a probed forward may change, saved before it: every buffer, and the KV rows its slots name."""

    def __init__(self, owner, dispatch):
        self.buffers = [(t, t.clone()) for _, t in owner.buffers.items()]
        caches = owner.kv_cache.tensors()
        slots = owner.buffers["slot_mapping"][: dispatch.num_tokens_padded]
        self.rows = slots.remainder(caches[0].shape[0]) if caches else None
        live = slots[: dispatch.num_tokens]
        self.live_rows = live[live >= 0]
        self.kv = [(c, c.index_select(0, self.rows)) for c in caches]

    def restore(self) -> None:
        for live, saved in self.buffers:
            live.copy_(saved)
        for cache, saved in self.kv:
            cache.index_copy_(0, self.rows, saved)


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
    return out


def block_size_of(owner) -> int:
    return owner.builder.block_size


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
