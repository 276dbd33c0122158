"""An engine's state as the bisector handles it: snapshots, outputs, differences, regions."""

from __future__ import annotations

import torch

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
    live = state_tensors(engine)
    meta_tensors = {name: getattr(meta, name) for name in METADATA_FIELDS}
    return {"live": live, "saved": snapshot_tensors(live),
            "meta": {k: v.clone() for k, v in meta_tensors.items()}, "meta_live": meta_tensors}


def restore(snap: dict) -> None:
    restore_tensors(snap["live"], snap["saved"])
    for name, tensor in snap["meta_live"].items():
        tensor.copy_(snap["meta"][name])


def outputs(engine, event, logits=None) -> dict[str, torch.Tensor]:
    """What a forward produced, over its real rows only (`logits`: another graph's output)."""
    n, t = event.num_rows, event.dispatch.num_tokens
    owner = engine.owner(event.owner)
    if event.owner == "target":
        out = {"logits": (event.logits if logits is None else logits)[:t].float().clone()}
    else:
        b = owner.buffers
        j = event.draft_step
        out = {"draft_tokens": b["draft_tokens"][:n, j].clone(), "draft_logprobs": b["draft_logprobs"][:n, j].clone(),
               "input_ids": b["input_ids"][:n].clone(), "hidden_states": b["hidden_states"][:n].float().clone()}
    for i, tensor in enumerate(owner.kv_cache.tensors()):
        out[f"kv{i}"] = tensor[:-1].float().clone()   # the trash row is padding's sink
    return out


def max_diff(a: dict, b: dict) -> tuple[float, list[str]]:
    """The largest difference between two outputs (inf for differing integers) and the names that differ."""
    worst, names = 0.0, []
    for name in a:
        x, y = a[name], b[name]
        if x.dtype in (torch.int64, torch.int32):
            d = float("inf") if bool((x != y).any()) else 0.0
        else:
            d = float((x - y).abs().max()) if x.numel() else 0.0
        if d > 0:
            names.append(name)
        worst = max(worst, d)
    return worst, names


def diff_rows(a: dict, b: dict, tol: float) -> list[int]:
    for name in ("logits", "hidden_states", "draft_tokens"):
        if name in a:
            x, y = a[name].float(), b[name].float()
            delta = (x - y).abs()
            per_row = delta.reshape(delta.shape[0], -1).amax(dim=1) if delta.dim() > 1 else delta
            return [int(i) for i in torch.nonzero(per_row > tol).flatten().tolist()]
    return []
