"""OUTPUT_ALIASED: the caller read a graph's output after another replay of its forward had overwritten it (and
POOL_ALIAS: after another forward's replay did, `pool.py`).

Graphs of one forward (the same callable at other batch sizes, or its pieces)
share a pool, and the pool check (`pool.py`) takes a graph's outputs as dead
once its forward runs again: the next graph's temporaries may then sit where
they were. An engine that kept an output by reference and reads it after that
reads the other graph's temporaries. This module checks that the caller agrees
with the pool check, by watching what it reads:

- at a checked replay of graph B, the bytes of each other graph A of B's
  forward that B's capture handed out as temporaries (not as B's outputs),
  and that B's replay changed, are watched, with A's output as A's replay
  left it;
- while anything is watched, a dispatch mode sees the program's ops between
  audited replays (never inside the audit, never inside a capture, never
  inside torch.compile'd code, which it leaves compiled); an op that reads
  watched bytes is the caller reading A's output after it was overwritten;
- confirmed by one experiment: the same op, run once more on a copy of A's
  output as its replay left it, gives other values. Then OUTPUT_ALIASED names
  A's output; the real op's result is what the program gets, as unaudited.

Bytes stop being watched when a replay writes them as its output (A's own
next replay, or another graph's output placed there), when the program writes
them, or when they are reported.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from dataclasses import dataclass

import torch
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_flatten

from parity.audit import kept, pool
from parity.audit.capture import cuda_capturing, current_frame
from parity.audit.infer import NO_KERNEL, not_callable
from parity.audit.rearm import Rearm
from parity.audit.state import Snapshot, bit_equal
from parity.audit.trace import byte_range, merged, minus, within, written_tensors


@dataclass
class _Watch:
    audit: "weakref.ReferenceType"     # A: the graph whose output was overwritten
    index: int                          # which of its outputs
    spans: list[tuple[int, int]]        # its bytes that hold the overwriting replay's temporaries
    saved: torch.Tensor                 # the output as A's replay (or the program since) left it
    culprit: str                        # the graph whose replay overwrote it
    found: dict | None = None           # another forward's replay overwrote it: the pool check's finding


_AUDITS: list["weakref.ReferenceType"] = []
_WATCHES: list[_Watch] = []
_PENDING: list[tuple] = []             # (A, index, spans, saved, culprit) between before_ and after_replay
_STATE = {"paused": 0, "pushed": False, "rearm": False}
_CLOCK = itertools.count(1)            # orders replays: an audit's `replayed_at` is its last one


def register(audit) -> None:
    """At capture: `audit`'s outputs may be overwritten by, and its replays may overwrite, its forward's."""
    _AUDITS[:] = [ref for ref in _AUDITS if ref() is not None and ref() is not audit]
    _AUDITS.append(weakref.ref(audit, _died))
    kept.watch(audit)


def _died(_ref) -> None:
    """An audit was collected: once no live graph is left to watch for, the watcher comes off (left on, it would
    see every op the program runs from then on, for nothing)."""
    _WATCHES[:] = [w for w in _WATCHES if w.audit() is not None]
    if not _STATE["paused"] and not _WATCHES and not kept.wanted():
        _pop()


def audits() -> list:
    """The audits of this process's graphs that are alive, oldest capture first."""
    return [a for a in (ref() for ref in _AUDITS) if a is not None]


def _clobbered(a, b) -> list[tuple[int, list]]:
    """(output index, byte spans) of A's outputs that B's capture handed out as temporaries."""
    temporaries = minus(b.record.produced, merged(byte_range(t) for t in b.record.outputs if t.numel()))
    found = []
    for i, out in enumerate(a.record.outputs):
        spans = within(temporaries, *byte_range(out)) if out.numel() else []
        if spans:
            found.append((i, spans))
    return found


def before_replay(culprit, checked: bool) -> None:
    """Before a replay of `culprit`: the watcher steps aside; on a checked replay, what it may overwrite is saved."""
    _STATE["paused"] += 1
    _pop()
    _PENDING.clear()
    kept.before_replay(culprit, checked)
    if not checked:
        return
    forward = pool.forward_of(culprit)
    audits = [a for a in (ref() for ref in _AUDITS) if a is not None and a.record is not None]
    for a in audits:
        if a is culprit or pool.forward_of(a) != forward:
            continue
        # NOTE: bytes a graph replayed since A placed its output in are that graph's output now (live, or
        # not, the pool check's to judge), not A's.
        later = merged(byte_range(t) for c in audits if c.replayed_at > a.replayed_at
                       for t in c.record.outputs if t.numel())
        for index, spans in _clobbered(a, culprit):
            spans = minus(spans, later)
            if not spans:
                continue
            old = next((w.saved for w in _WATCHES if w.audit() is a and w.index == index), None)
            saved = old if old is not None else a.record.outputs[index].clone()
            _PENDING.append((a, index, spans, saved, culprit.name))


def after_replay(culprit) -> None:
    """After a replay of `culprit` (its state as the real replay left it): update what is watched, watch again."""
    outputs = merged(byte_range(t) for t in culprit.record.outputs if t.numel())
    for w in list(_WATCHES):
        w.spans = minus(w.spans, outputs)
        if w.audit() is None or w.audit() is culprit or not w.spans:
            _WATCHES.remove(w)
    for a, index, spans, saved, name in _PENDING:
        if bit_equal(a.record.outputs[index], saved):
            continue                      # NOTE: the replay left its bytes as they were: nothing to read wrongly
        known = next((w for w in _WATCHES if w.audit() is a and w.index == index), None)
        if known is not None:
            known.spans = merged(known.spans + spans)
        else:
            _WATCHES.append(_Watch(weakref.ref(a), index, spans, saved, name))
    _PENDING.clear()
    for a, index, saved, name, found in pool.overwritten():     # another forward's output: the pool check's
        # NOTE: bytes that hold the culprit's own outputs now are read as those, never as A's.
        spans = minus([byte_range(a.record.outputs[index])], outputs)
        _WATCHES[:] = [w for w in _WATCHES if not (w.audit() is a and w.index == index)]
        if spans:
            _WATCHES.append(_Watch(weakref.ref(a), index, spans, saved, name, found))
    kept.after_replay(culprit, culprit.replayed_at)
    culprit.replayed_at = next(_CLOCK)
    _STATE["paused"] -= 1
    # NOTE: only onto an empty stack: a mode the program entered before would, on its exit, pop the watcher.
    if (_WATCHES or kept.wanted()) and not _STATE["pushed"] and not _STATE["paused"] \
            and not torch._C._len_torch_dispatch_stack():
        _push()


def stop() -> None:
    """Forget every watch and take the watcher off the stack (end of an auto_audit scope)."""
    _WATCHES.clear()
    kept.stop()
    _pop()


def _push() -> None:
    """The watcher onto the (empty) dispatch stack; inside `torch.inference_mode()`, its re-arming function mode
    too (elsewhere nothing takes the watcher's keys off, and a function mode on the stack would make dynamo trace
    it into compiled code the program runs between replays), onto a function stack holding at most the default
    device's mode (`torch.set_default_device`, which keeps itself at the bottom)."""
    _WATCHER.__enter__()
    _STATE["pushed"] = True
    stack = torch._C._len_torch_function_stack()
    if torch.is_inference_mode_enabled() and all(
            isinstance(torch._C._get_function_stack_at(i), DeviceContext) for i in range(stack)):
        _REARM.__enter__()
        _STATE["rearm"] = True


def _pop() -> None:
    """Both off their stacks, each where it is still on top (a mode the program entered since stays)."""
    stack = torch._C._len_torch_function_stack()
    if _STATE["rearm"] and stack and torch._C._get_function_stack_at(stack - 1) is _REARM:
        _REARM.__exit__(None, None, None)
        _STATE["rearm"] = False
    if _STATE["pushed"] and _get_current_dispatch_mode() is _WATCHER:
        _WATCHER.__exit__(None, None, None)
        _STATE["pushed"] = False


def _hit(tensors) -> tuple[_Watch, torch.Tensor] | None:
    for t in tensors:
        start, end = byte_range(t)
        for w in _WATCHES:
            if w.audit() is not None and within(w.spans, start, end):
                return w, t
    return None


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None and not_callable(frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _values(out, written) -> list[torch.Tensor]:
    return [t.clone() for t in [*tree_flatten(out)[0], *written] if isinstance(t, torch.Tensor)]


class _Reads(TorchDispatchMode):
    """Sees the program's ops while outputs are watched; confirms and reports a read of overwritten bytes."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True          # NOTE: torch.compile'd code stays compiled under the watcher

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _STATE["paused"] or current_frame() is not None or cuda_capturing():
            return func(*args, **kwargs)
        if func.is_view:
            out = func(*args, **kwargs)
            kept.tag(args, out)
            return out
        if not (_WATCHES or kept.saved()) or func._schema.name in NO_KERNEL:
            return func(*args, **kwargs)
        written = written_tensors(func, args, kwargs)
        reads = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.numel()
                 and not any(t is w for w in written)]
        # NOTE: a view kept from an earlier replay of its own graph first: what that replay left is what it holds.
        view = kept.stale(reads)
        found = _hit(reads) if view is None else (
            _Watch(weakref.ref(view[0]), view[1], [byte_range(view[3])], view[2], view[0].name), view[3])
        if found is None:
            out = func(*args, **kwargs)
            _written(written)
            return out
        return _confirm(found[0], func, args, kwargs, written)


def _written(written) -> None:
    """Bytes the program writes are its own values from then on."""
    spans = merged(byte_range(t) for t in written if t.numel())
    for w in list(_WATCHES):
        w.spans = minus(w.spans, spans)
        if not w.spans:
            _WATCHES.remove(w)


def _confirm(watch: _Watch, func, args, kwargs, written):
    """The op on a copy of the output as its replay left it, then for real; OUTPUT_ALIASED if they differ."""
    audit = watch.audit()
    output = audit.record.outputs[watch.index]
    keep = Snapshot([output, *written])
    try:
        output.copy_(watch.saved)
        as_left = _values(func(*args, **kwargs), written)
    finally:
        keep.restore()
    out = func(*args, **kwargs)
    _WATCHES[:] = [w for w in _WATCHES if w is not watch]
    if all(bit_equal(a, b) for a, b in zip(as_left, _values(out, written))):
        return out              # NOTE: what it read of the overwritten bytes did not change its result
    name, where = audit.record.output_names[watch.index], _caller()
    if watch.found is not None:
        found = dict(watch.found)
        found["evidence"] = [*found["evidence"], f"then {func} at {where} read it: the same {func} on a copy of "
                             f"{name} as {audit.name!r}'s replay left it gives other values"]
        audit._report(audit._diagnosis(found.pop("kind"), found.pop("buffers"), **found))
        return out
    audit._report(audit._diagnosis(
        "OUTPUT_ALIASED", [name], captured_address=output.data_ptr(), replays=0, evidence=[
            f"output {name} of graph {audit.name!r} was written again by its own next replay: called eagerly it "
            f"returns a new tensor every call, and a view kept of an earlier call's keeps that call's values"
            if watch.culprit == audit.name else
            f"output {name} of graph {audit.name!r} was overwritten by the replay of {watch.culprit!r} (the same "
            f"forward; its temporaries share the pool), before {audit.name!r} replayed again",
            f"then {func} at {where} read it: whatever read {name} there kept it by reference past that replay; "
            f"copy it (or read it) before the next replay of its forward",
            f"the same {func} on a copy of {name} as {audit.name!r}'s replay left it gives other values"],
        experiment=f"run the read ({func}) once more on a copy of {name} as its graph's replay left it"))
    return out


_WATCHER = _Reads()
_REARM = Rearm(lambda: _STATE["pushed"])
