"""Checks of a replay that need no shadow run, or decide what it runs on.

- `arguments`: what the replay stands for: the arguments the engine's wrapper was called with (a
  `KeyedAudit`'s `live_arguments`) where they have the captured structure, shapes and dtypes, else the
  captured ones;
- `inputs_overwritten`: POOL_ALIAS when the graph reads inputs from memory its own capture handed out and the
  replay changed them (`pool.inputs_overwritten`);
- `smaller_than_the_batch`: DESCRIPTOR_MISMATCH when the batch holds more real rows than the graph's outputs;
- `wrong_graph`: WRONG_GRAPH when the code replaying the graph holds the callable another graph was captured
  for, and not this graph's own.
"""

from __future__ import annotations

import inspect
import sys

import torch
from torch.utils._pytree import tree_flatten

from parity.audit import lifetime
from parity.audit.infer import not_callable


def arguments(audit) -> tuple[tuple, dict]:
    """What the replay stands for: the arguments the engine's wrapper was called with (`live_arguments`, a
    `KeyedAudit`'s) where they have the captured structure, tensor shapes and dtypes; else the captured ones."""
    record, live = audit.record, audit.live_arguments() if audit.live_arguments is not None else None
    if live is None:
        return record.args, record.kwargs
    flat_live, spec_live = tree_flatten(live)
    flat_captured, spec_captured = tree_flatten((record.args, record.kwargs))
    alike = spec_live == spec_captured and all(
        (a.shape, a.dtype) == (b.shape, b.dtype) if isinstance(b, torch.Tensor) else not isinstance(a, torch.Tensor)
        for a, b in zip(flat_live, flat_captured))
    return live if alike else (record.args, record.kwargs)


def inputs_overwritten(audit, names: list[str]) -> dict:
    """POOL_ALIAS: inputs the graph reads sit in memory its own capture handed out, and this replay changed
    them; no shadow experiment on such a graph is sound, so none is run."""
    return audit._diagnosis("POOL_ALIAS", names, evidence=[
        f"{', '.join(names)}: read by the graph from memory its own capture handed out as temporaries: the "
        "tensor was free in the pool when the graph was captured (its producer held it only weakly, or let it "
        "go), so every replay overwrites what it reads", f"replay {audit.replays} changed them"],
        experiment="compare the byte ranges the graph reads with those its capture allocated; their bytes "
                   "before and after the replay")


def smaller_than_the_batch(audit) -> dict | None:
    """DESCRIPTOR_MISMATCH when the batch holds more real rows (`num_valid`) than the graph was captured for
    (its outputs' batch size): the rows past its capture are never computed; the replay is shadow-checked, and
    this stands only when the graph equals its callable at its own shape."""
    num_valid = audit.num_valid_now()
    # NOTE: the largest leading dimension of its outputs (or the declared padded_rows): a graph may also return
    # a short tensor first (a count, a flag).
    rows = [int(t.shape[0]) for t in audit.record.outputs if t.dim()]
    padded = audit._padded_rows if audit._padded_rows is not None else max(rows, default=None)
    if num_valid is None or padded is None or num_valid <= padded:
        return None
    return audit._diagnosis("DESCRIPTOR_MISMATCH", ["descriptor"], evidence=[
        f"replay {audit.replays}: the batch holds {num_valid} real rows (num_valid) and the graph was captured "
        f"for {padded}: the rows past {padded} are not computed; the engine looked up a graph of another "
        "size than the batch it built", "the graph equals its callable run eagerly at its own shape on the same "
        "live inputs (shadow check)"], experiment="compare num_valid with the graph's captured batch size")


def wrong_graph(audit) -> dict | None:
    """WRONG_GRAPH: the engine function that replays the graph was handed, as a parameter, the function another
    audited graph was captured for, and no parameter is this graph's own: it meant that forward and looked up
    this graph (a key without the phase, one table for two owners). The graph equals its own callable, so a
    shadow check finds nothing; the outputs it overwrites in the other forward's pool are its consequence."""
    site = sys._getframe(1)
    while site is not None and not_callable(site.f_code.co_filename):
        site = site.f_back
    if site is None:
        return None
    own, code = audit.record.fn, site.f_code
    # NOTE: its parameters only: a function handed `fn` and a graph runs one of them (a dispatcher); a local
    # picked up from an attribute may just as well be meant for the next replay.
    parameters = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    held = {name: site.f_locals.get(name) for name in parameters if name != "self"}
    held = {name: value for name, value in held.items() if inspect.ismethod(value) or inspect.isfunction(value)}
    if any(value == own for value in held.values()):
        return None
    others = [a for a in lifetime.audits() if a is not audit and a.record is not None and a.record.fn != own]
    for name, value in held.items():
        meant = next((a for a in others if a.record.fn == value), None)
        if meant is not None:
            where = f"{site.f_code.co_name} ({site.f_code.co_filename}:{site.f_lineno})"
            return audit._diagnosis("WRONG_GRAPH", [name], evidence=[
                f"replay {audit.replays}: {where} replays {audit.name}, captured for "
                f"{_called(own)}, while its `{name}` is {_called(value)}, the function {meant.name} was captured "
                "for", "the graph looked up belongs to another forward"],
                experiment="compare the function the replaying frame holds with the one each graph was captured for")
    return None


def _called(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
