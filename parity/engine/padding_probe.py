"""The padding contract, checked exactly: live outputs must not change when the padding does.

A graph and its strict padded reference run the same padding code, so a bug
in it (a padded row's entry read for a live row, a metadata tail left by a
larger batch, a padded token writing a slot a live request owns) corrupts
both identically and the bitwise verdict cannot see it. The probe re-runs
padded forwards of the reference under two different poisons of everything
that is not a live entry:

- FREE padded entries (padded tokens' ids, positions, hidden states; padded rows' block tables, request ids);
- the tail of every batch-indexed input buffer past the padded shape, INERT
  ones included: what a correct forward at this shape never reads;
- KV slots no request holds, and a hybrid target's state slots (`padding_state`).
(`buffers.fill_like_live`: A copies live entries, B differs from A everywhere.)

INERT padded entries (PAD slots, zero seq_lens, clamped query_start_loc) keep
the builder's values: they carry meaning (a PAD slot skips the write), so the
contract for them is their exact pad value, which is checked.

Live outputs (returned rows, the rows the forward declares it writes, the
live tokens' KV rows, live rows' states) must agree bit for bit. When they do not, re-runs from
the pre-state name what leaks: a contract repair, padded KV writes landing in
live slots, or one region's poison alone; and, read first from the indices,
padded rows writing over live rows in one op (`padding_routes`).

Cost: one extra forward per probed forward, a few per region on the first leak
of each phase. Probed: the first forward of every distinct (owner, phase,
padded shape, live shape), and every `EVERY`th padded forward (a stale entry
needs a larger batch first); the others get poison A only.
"""

from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from parity.engine.buffers import fill_like_live
from parity.engine.padding_contract import agreed
from parity.engine.padding_regions import (PreState, Region, advance_origin, differing, live_outputs,
                                           move_inert, off_contract, padded_kv_writes, regions, restore_contract,
                                           state_regions)
from parity.engine.padding_routes import names_of, overwrites_first, route_regions, with_overwrites
from parity.engine.padding_state import STATE_KINDS, poison_state, sentinel_tail, slot_evidence

# KV slots no live request owns hold one of these under each poison (finite: a masked score times a
# poisoned value must stay 0).
KV_POISON = {"A": 0.375, "B": -1.25}
MAX_LEAKS_LOCALISED = 4
EVERY = 16


@dataclass
class Leak:
    owner: str
    phase: str
    forward: int                  # this owner's forward count in the run (0-based)
    step: int                     # the engine step
    draft_step: int | None
    num_tokens: int
    num_tokens_padded: int
    num_reqs: int
    num_reqs_padded: int
    outputs: list[str]            # live outputs that differ between the two poisons
    buffers: list[str] = field(default_factory=list)    # what leaks (empty: not isolated)
    regions: list[str] = field(default_factory=list)    # e.g. "seq_lens padded rows off the pad value 0"
    kinds: list[str] = field(default_factory=list)      # contract, padded, tail, kv, writes, inert; race
    evidence: list[str] = field(default_factory=list)
    experiment: str | None = None                       # the experiment that isolated `buffers`

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class PaddingProbe:
    """Runs a reference's padded forwards, probing the padding contract of each new padded shape."""

    def __init__(self, free_blocks, block_size: int, step=lambda: None, inert_reads: bool = False, routes=None):
        self.free_blocks = free_blocks          # () -> block ids no request holds, now
        self.step = step                        # () -> the engine step in progress
        # A diagnosis experiment, not a verdict: also move each INERT buffer's padded entries to another
        # well-formed value, to see whether a live row reads them (`inert_regions`).
        self.inert_reads = inert_reads
        self.routes = routes                    # the reader of indexed reads and writes (`padding_routes`)
        self.block_size = block_size
        self.seen: set = set()
        self.forwards: dict[str, int] = {}
        self.padded_forwards = 0
        self.probed = 0
        self.seconds = 0.0
        self.leaks: list[Leak] = []
        self.localised_phases: set = set()
        self._salt = 0
        self._holders: list[str] = []     # who holds the state slots padded rows name (`padding_state`)

    # --- the executor's entry --------------------------------------------------------

    def execute(self, owner, dispatch, fn, meta):
        index = self.forwards.get(owner.name, 0)
        self.forwards[owner.name] = index + 1
        self.padded_forwards += 1
        key = (owner.name, dispatch.phase, dispatch.num_tokens_padded, dispatch.num_reqs_padded,
               dispatch.num_tokens, dispatch.num_reqs)
        if key in self.seen and self.padded_forwards % EVERY:
            owner.poison_padding(dispatch)
            return fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta)
        self.seen.add(key)
        start = time.perf_counter()
        try:
            return self._probe(owner, dispatch, fn, meta, index)
        finally:
            self._sync(owner)
            self.seconds += time.perf_counter() - start

    def summary(self) -> dict:
        return {"padded_forwards": self.padded_forwards, "probed_forwards": self.probed,
                "sampling": f"the first forward of each distinct (owner, phase, padded shape, live shape), and "
                            f"every {EVERY}th padded forward",
                "leaks": [leak.as_dict() for leak in self.leaks]}

    # --- one probed forward ------------------------------------------------------------

    def _probe(self, owner, dispatch, fn, meta, index: int):
        self.probed += 1
        self._salt += 1
        pre = PreState(owner, dispatch)
        every = regions(owner.buffers, dispatch) + state_regions(owner)
        run = lambda b_regions, repair=(), watch=None: self._run(owner, dispatch, fn, meta, pre,  # noqa: E731
                                                                    every, b_regions, repair, watch)
        out_b = run(every)[0]       # not the result: forward B's logits need not live through forward A
        # Poison A's run is watched by the routes reader: padded rows writing over a live row's element in one op
        # are a breach whether or not the race shows in this run's values (on CUDA it may not, by chance).
        recorder = self.routes.recorder(names_of(owner)) if self.routes is not None else None
        out_a, result = run([], watch=recorder)
        changed = differing(out_a, out_b)
        if not changed:
            return agreed(self, owner, dispatch, meta, index, run, out_a, result, recorder)
        leak = self._leak(owner, dispatch, meta, index, changed)
        phase = (owner.name, dispatch.phase)
        if phase not in self.localised_phases and len(self.localised_phases) < MAX_LEAKS_LOCALISED:
            self.localised_phases.add(phase)
            # From the indices, before any experiment: padded rows writing over live rows (a race on CUDA).
            overwritten = overwrites_first(self, leak, owner, dispatch, run)
            # Padded rows racing live ones can reproduce by chance: asked three times when the indices say they do.
            moved = next((d for d in (differing(out_a, run([])[0]) for _ in range(3 if overwritten else 1)) if d), [])
            if moved:
                leak.evidence.append(f"the forward does not reproduce its own live outputs under the same poison "
                                     f"({', '.join(moved[:4])})")
                if overwritten:     # the padded rows' writes race the live rows': no experiment on it
                    leak.kinds.append("race")
                else:
                    self._repair_race(leak, owner, dispatch, meta, run, every, pre)
                _, result = run([])
                return result
            # Where writes race, experiments may agree by chance: their answer stands only if it repeats.
            twin = copy.deepcopy(leak) if overwritten else None
            for localised in (leak, twin) if twin is not None else (leak,):
                self._localise(localised, owner, dispatch, meta, run, out_a, every, pre)
            with_overwrites(leak, overwritten, twin)
            # The forward whose state the run goes on from is poison A's, as for every other forward.
            _, result = run([])
        return result

    def _repair_race(self, leak: Leak, owner, dispatch, meta, run, every, pre: PreState) -> None:
        """A forward that does not reproduce itself (padded tokens racing live ones for a KV slot, on CUDA):
        the contract breach whose repair makes it reproduce and the two poisons agree is named; else nothing."""
        pre.restore()
        off = off_contract(owner.buffers, dispatch)
        self._holders = slot_evidence(owner, dispatch, sorted(off))     # before a repair rewrites them
        for names in [[name] for name in sorted(off)] + ([sorted(off)] if len(off) > 1 else []):
            fixed_a, _ = run([], repair=names)
            if not differing(fixed_a, run([], repair=names)[0]) and not differing(fixed_a, run(every, repair=names)[0]):
                self._name_breach(leak, names, off, owner, dispatch, meta)
                leak.kinds.append("race")
                leak.evidence.append(f"with {', '.join(names)} padded entries at their pad values the forward "
                                     f"reproduces itself: padded tokens raced live ones")
                return
        leak.evidence.append("no contract repair makes it reproduce: no region can be isolated")

    def _name_breach(self, leak: Leak, names: list[str], off: dict, owner, dispatch, meta) -> None:
        """Name the breached buffers, and a registered pad value that the step advance turns into the breach."""
        origin, why = advance_origin(owner, dispatch, meta) if dispatch.phase == "draft_step" else ([], [])
        leak.buffers, leak.kinds = sorted(set(origin) | set(names)), ["contract"]
        leak.regions = [f"{name} padded entries off the pad value {off[name][0]} ({off[name][1]} of them)"
                        for name in names]
        leak.experiment = (f"the padded forward re-run under both poisons with {', '.join(names)}'s padded entries "
                           f"set to their pad values")
        leak.evidence += [f"with {', '.join(names)} padded entries set to their pad values, the two poisons give the "
                          f"same live outputs: the builder breaks the padding contract"] + why
        leak.evidence += [line for line in self._holders if any(f" {name} " in line for name in names)]

    def _leak(self, owner, dispatch, meta, index: int, outputs: list[str]) -> Leak:
        draft_step = getattr(meta, "draft_step", None) if owner.name != "target" else None
        leak = Leak(owner.name, dispatch.phase, index, self.step(), draft_step, dispatch.num_tokens,
                    dispatch.num_tokens_padded, dispatch.num_reqs, dispatch.num_reqs_padded, outputs)
        self.leaks.append(leak)
        return leak

    def _localise(self, leak: Leak, owner, dispatch, meta, run, out_a, every, pre: PreState) -> None:
        pre.restore()
        off = off_contract(owner.buffers, dispatch)
        self._holders = slot_evidence(owner, dispatch, sorted(off))     # before a repair rewrites them
        if off:
            # The smallest repair first: each breached buffer alone, then all of them.
            for names in [[name] for name in sorted(off)] + ([sorted(off)] if len(off) > 1 else []):
                fixed_a, _ = run([], repair=names)
                fixed_b, _ = run(every, repair=names)
                if not differing(fixed_a, fixed_b):
                    self._name_breach(leak, names, off, owner, dispatch, meta)
                    return
            leak.evidence.append(f"{', '.join(sorted(off))} padded entries are off their pad values, but restoring "
                                 f"them does not make the two poisons agree")
        written = padded_kv_writes(owner, dispatch, run, every, pre.live_rows, self.block_size)
        if written:
            leak.buffers, leak.kinds = ["slot_mapping"], ["writes"]
            leak.regions = [f"padded tokens' KV writes land in {written} slot(s) live requests own"]
            leak.experiment = "the KV slots live requests own, compared after the forward under each poison"
            leak.evidence.append("the padded tokens' poisoned inputs reach the live requests' own KV (first layer): "
                                 "their writes are not routed to the PAD slot")
            return
        leaking = [r for r in every if differing(out_a, run([r])[0])]
        routed, why = route_regions(self, owner, dispatch, run, leaking)
        leak.buffers = sorted({name for r in leaking for name in routed.get((r.buffer, r.kind), [r.buffer])})
        leak.regions = [r.label() for r in leaking]
        leak.kinds = sorted({r.kind for r in leaking})
        if leaking:
            leak.experiment = ("the padded forward re-run with poison B in one region alone, poison A elsewhere"
                               + ("; its indexed reads recorded under each" if routed else ""))
            leak.evidence.append(f"poison B in {' / '.join(r.label() for r in leaking)} alone (poison A everywhere "
                                 f"else) changes live outputs")
            leak.evidence += why
        else:
            leak.evidence.append("no single poisoned region changes live outputs alone (they leak jointly)")

    def _run(self, owner, dispatch, fn, meta, pre: PreState, every: list[Region], b_regions: list[Region],
             repair: list[str] = (), watch=None):
        """Restore the pre-state, set `repair`'s padded entries to their pad values, poison (B in
        `b_regions`, A elsewhere), run (under `watch`, a recorder, when given), and read the live outputs."""
        pre.restore()
        restore_contract(owner.buffers, dispatch, repair)
        b_set = {(r.buffer, r.kind) for r in b_regions}
        for region in every:
            self._poison(owner, dispatch, region, "B" if (region.buffer, region.kind) in b_set else "A")
        for region in b_regions:
            if region.kind == "inert":
                self._poison(owner, dispatch, region, "B")
        with watch if watch is not None else nullcontext():
            result = fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta)
        return live_outputs(owner, dispatch, result, pre.live_rows), result

    def _poison(self, owner, dispatch, region: Region, pattern: str) -> None:
        buffers = owner.buffers
        if region.kind in ("kv",) + STATE_KINDS:
            return self._poison_kv(owner, pattern) if region.kind == "kv" else poison_state(owner, dispatch,
                                                                                           region.kind, pattern)
        tensor, spec = buffers[region.buffer], buffers.spec(region.buffer)
        if region.kind == "inert":
            move_inert(tensor, spec, dispatch, self._salt)
            return
        live = spec.used(dispatch.num_tokens, dispatch.num_reqs)
        holes = spec.padded(dispatch) if region.kind == "padded" else spec.tail(dispatch, tensor.shape[0])
        if not sentinel_tail(owner, region.buffer, tensor, holes, pattern):
            fill_like_live(tensor, live, holes, pattern, self._salt)

    def _poison_kv(self, owner, pattern: str) -> None:
        ids = sorted(self.free_blocks())
        value = KV_POISON[pattern]
        index = torch.tensor(ids, dtype=torch.int64, device=owner.buffers.device) if ids else None
        for cache in owner.kv_cache.tensors():
            cache[-1].fill_(value)     # the trash row
            if index is not None:
                cache[:-1].unflatten(0, (-1, self.block_size)).index_fill_(0, index, value)

    @staticmethod
    def _sync(owner) -> None:
        return torch.cuda.synchronize(owner.buffers.device) if owner.buffers.device.type == "cuda" else None
