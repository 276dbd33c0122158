"""An engine's state as the bisector handles it: what a forward reads and writes, its pre-state, its outputs.

The ground is the audit's (`parity.audit.state`): a pre-state is a `Snapshot` of storages' bytes, and a
difference is `delta` (a NaN on one side only is an infinite difference, on both sides none). What is the
harness's own: which tensors an engine's forward can touch, and its outputs by name over the real entries.
"""

from __future__ import annotations

import torch

from parity.audit.state import Snapshot, delta
from parity.engine.buffers import BufferSpec
from parity.graphs import host_state
from parity.graphs.manifest import live_object_tensor
from parity.graphs.tp_agree import peer_memory

METADATA_FIELDS = ("query_start_loc", "seq_lens", "slot_mapping", "block_table", "positions", "window_start")


def state_tensors(engine) -> list[torch.Tensor]:
    """Every tensor a forward may read or write: every owner's registry and KV cache, and every tensor its
    captured graphs read that the registry no longer holds (a buffer rebound after capture: the graph keeps
    reading and writing the orphan, so a forward's pre-state includes it), and the tensors other than weights
    the graphs read through an owner's attributes."""
    tensors = [t for owner in engine.owners() for t in owner.state_tensors()]
    captured, paths = {}, {}
    for owner in engine.owners():
        for entry in getattr(owner.executor, "graphs", {}).values():
            for item in entry.manifest:
                if item.holder == "object":
                    # Weights are never written by a forward (and at 8B a copy is 16 GB): only the other
                    # tensors an owner keeps, as captured and as the attribute holds them now (each attribute
                    # path once: every graph of the owner names the same ones).
                    captured[id(item.tensor)] = item.tensor
                    paths.setdefault((id(owner), item.path), (item, owner))
                elif item.tensor is not None:
                    captured[id(item.tensor)] = item.tensor
    for item, owner in paths.values():
        live = live_object_tensor(item, owner)
        captured[id(live)] = live
    foreign = peer_memory()       # under TP: another rank's memory is that rank's state, not this one's
    # A `Snapshot` saves each storage once, whichever view reaches it.
    captured = [t for t in captured.values() if t is not None and not isinstance(t, torch.nn.Parameter)]
    return [t for t in tensors + captured if t.untyped_storage().data_ptr() not in foreign]


def snapshot(engine, meta, owner: str) -> dict:
    """The pre-state of a forward of `owner`: the bytes of every tensor of the engine and of the metadata
    (`Snapshot`: `before(t)` gives any of them as it was), and the host values of the forward's owner (a counter
    the forward advances itself is part of what it starts from; walking the other owner's too, at every forward of
    a lockstep, was a fifth of a diagnosis's time)."""
    fields = {name: getattr(meta, name, None) for name in METADATA_FIELDS}
    fields = {name: t for name, t in fields.items() if isinstance(t, torch.Tensor)}   # as held now: `meta`
    holder = engine.owner(owner)
    return {"tensors": Snapshot([*state_tensors(engine), *fields.values()]), "meta": fields,
            "host": {owner: (holder, host_state.host_values(holder))}}


def restore(snap: dict) -> None:
    snap["tensors"].restore()
    for owner, values in snap["host"].values():
        host_state.restore(values, owner)


def outputs(engine, event, returned=None) -> dict[str, torch.Tensor]:
    """Everything a forward produced, over its real entries: what it returned (`returned`: what a re-run or
    another graph returned instead), every buffer it writes (a draft output at its draft step's column), and
    the KV cache. A divergence is found at the forward that wrote it, not where a later one reads it."""
    forward = engine.owner(event.owner).forward(event.phase)
    owner, t = engine.owner(event.owner), event.dispatch.num_tokens
    out = {}
    for i, tensor in enumerate(event.returned if returned is None else returned):
        if isinstance(tensor, torch.Tensor):
            out[forward.outputs[i] if i < len(forward.outputs) else f"output {i}"] = _real(tensor[:t])
    for name, index in forward.writes:
        written = owner.buffers[name][BufferSpec(index).used(t, event.num_rows)]
        # A draft output: this step's columns so far (this forward's, and the earlier ones this step's forwards
        # wrote, which it must leave alone); later columns still hold the previous step's drafts.
        out[name] = _real(written[:, : event.draft_step + 1] if name in forward.step_columns else written)
    for i, tensor in enumerate(owner.kv_cache.tensors()):
        out[f"kv{i}"] = tensor[:-1].float().clone()   # the trash row is padding's sink
    return out


def _real(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float().clone() if tensor.is_floating_point() else tensor.clone()


def max_diff(a: dict, b: dict) -> tuple[float, list[str]]:
    """The largest difference between two outputs (inf for differing integers) and the names that differ."""
    worst, names = 0.0, []
    for name in a:
        if name not in b:     # an output the other run did not produce
            worst, names = float("inf"), names + [name]
            continue
        x, y = a[name], b[name]
        if x.dtype in (torch.int64, torch.int32):
            d = float("inf") if bool((x != y).any()) else 0.0
        else:
            d = float(delta(x, y).max()) if x.numel() else 0.0
        if d > 0:
            names.append(name)
        worst = max(worst, d)
    return worst, names


def diff_rows(a: dict, b: dict) -> list[int]:
    """The rows that differ of the first output that differs: logits, hidden states and draft tokens first, then
    every other output but the KV cache (whose rows are slots, not the batch's)."""
    names = [n for n in ("logits", "hidden_states", "draft_tokens") if n in a]
    for name in names + [n for n in a if n not in names and not n.startswith("kv")]:
        apart = delta(a[name], b[name])
        if not apart.numel():
            continue
        per_row = apart.reshape(apart.shape[0], -1).amax(dim=1) if apart.dim() > 1 else apart
        rows = [int(i) for i in torch.nonzero(per_row > 0).flatten().tolist()]
        if rows:
            return rows
    return []
