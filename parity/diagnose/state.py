"""An engine's state as the bisector handles it: snapshots, outputs, differences, regions."""

from __future__ import annotations

import torch

from parity.engine.buffers import BufferSpec
from parity.graphs import host_state
from parity.graphs.manager import restore_tensors, snapshot_tensors
from parity.graphs.manifest import live_object_tensor

METADATA_FIELDS = ("query_start_loc", "seq_lens", "slot_mapping", "block_table", "positions", "window_start")


def executor_of(engine, owner: str):
    return engine.owner(owner).executor


def registry_of(engine, owner: str):
    return engine.owner(owner).buffers


def forward_fn(engine, owner: str, phase: str):
    return engine.owner(owner).forward(phase).fn


def state_tensors(engine) -> list[torch.Tensor]:
    """Every tensor a forward may read or write: every owner's registry and KV cache, and every tensor its
    captured graphs read that the registry no longer holds (a buffer rebound after capture: the graph keeps
    reading and writing the orphan, so a forward's pre-state includes it), and the tensors other than weights
    the graphs read through an owner's attributes."""
    tensors = [t for owner in engine.owners() for t in owner.state_tensors()]
    captured = []
    for owner in engine.owners():
        for entry in getattr(owner.executor, "graphs", {}).values():
            for item in entry.manifest:
                if item.holder == "object":
                    # Weights are never written by a forward (and at 8B a copy is 16 GB): only the other
                    # tensors an owner keeps, as captured and as the attribute holds them now.
                    live = live_object_tensor(item, owner)
                    captured += [t for t in (item.tensor, live)
                                 if t is not None and not isinstance(t, torch.nn.Parameter)]
                elif item.tensor is not None:
                    captured.append(item.tensor)
    # One tensor per storage: a view the metadata object held of a registry buffer is saved with the buffer.
    held = {t.untyped_storage().data_ptr() for t in tensors}
    for t in captured:
        if t.untyped_storage().data_ptr() not in held:
            held.add(t.untyped_storage().data_ptr())
            tensors.append(t)
    return tensors


def snapshot(engine, meta) -> dict:
    """A forward's pre-state: its tensors, the metadata's, and every owner's host values (a counter the forward
    advances itself is part of what it starts from)."""
    live = state_tensors(engine)
    meta_tensors = {name: getattr(meta, name) for name in METADATA_FIELDS}
    return {"live": live, "saved": snapshot_tensors(live),
            "meta": {k: v.clone() for k, v in meta_tensors.items()}, "meta_live": meta_tensors,
            "host": {owner.name: (owner, host_state.host_values(owner)) for owner in engine.owners()}}


def restore(snap: dict) -> None:
    restore_tensors(snap["live"], snap["saved"])
    for name, tensor in snap["meta_live"].items():
        tensor.copy_(snap["meta"][name])
    for owner, values in snap["host"].values():
        host_state.restore(values, owner)


def host_moves(snap: dict, owner: str) -> dict:
    """{path: (in the snapshot, now)} for the host values of `owner` that moved since `snap` was taken."""
    holder, values = snap["host"][owner]
    return host_state.moved(values, holder)


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


def delta(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """|x - y| elementwise in float32, where a NaN or an infinity on one side only is an infinite difference and
    a NaN on both sides none: a graph-only NaN is a divergence, not a match."""
    x, y = x.float(), y.float()
    out = (x - y).abs()
    same = (x == y) | (x.isnan() & y.isnan())
    return torch.where(same, torch.zeros_like(out), torch.where(out.isnan(), float("inf"), out))


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


def diff_rows(a: dict, b: dict, tol: float) -> list[int]:
    """The rows past `tol` of the first output that differs: logits, hidden states and draft tokens first, then
    every other output but the KV cache (whose rows are slots, not the batch's)."""
    names = [n for n in ("logits", "hidden_states", "draft_tokens") if n in a]
    for name in names + [n for n in a if n not in names and not n.startswith("kv")]:
        apart = delta(a[name], b[name])
        if not apart.numel():
            continue
        per_row = apart.reshape(apart.shape[0], -1).amax(dim=1) if apart.dim() > 1 else apart
        rows = [int(i) for i in torch.nonzero(per_row > tol).flatten().tolist()]
        if rows:
            return rows
    return []
