"""Faults at one seam: each catalogued name is a mixin over one engine part or the graph runner,
or a capture-policy value.

`apply` stacks the mutations of every injected fault onto `EngineParts` and
`CapturePolicy`, so the engine and the graph installer receive classes and
policy values, never fault names.
"""

from __future__ import annotations

import copyreg
import dataclasses
import functools

from parity.engine.parts import EngineParts
from parity.faults import hybrid_mutations as h
from parity.faults import layout_mutations as lay
from parity.faults import mutations as m
from parity.faults import overlap_mutations as o
from parity.faults import runner_mutations as r
from parity.faults import tp_mutations as tp
from parity.faults import tree_mutations as t
from parity.graphs.policy import CapturePolicy


@dataclasses.dataclass(frozen=True)
class Mutation:
    """Where a fault strikes: a mixin over one engine part, or a capture-policy value."""

    parts: tuple[str, ...] = ()        # the EngineParts fields it changes ("executor": the policy's)
    mixin: type | None = None
    policy: dict = dataclasses.field(default_factory=dict)


BUILDERS = ("target_builder", "drafter_builder")
MUTATIONS: dict[str, Mutation] = {
    "reassign-seq-lens": Mutation(BUILDERS, m.ReassignSeqLens),
    "reassign-query-start-loc": Mutation(("drafter_builder",), m.ReassignQueryStartLoc),
    "stale-slot-mapping": Mutation(BUILDERS, m.StaleSlotMapping),
    "stale-block-table": Mutation(BUILDERS, m.StaleBlockTable),
    "frozen-draft-step": Mutation(("proposer",), m.FrozenDraftStep),
    "frozen-window-state": Mutation(BUILDERS, m.FrozenWindowState),
    "padded-rows-unmasked": Mutation(BUILDERS, m.PaddedRowsUnmasked),
    "shared-pool-alias": Mutation(policy={"shared_drafter_pool": True}),
    "capture-without-metadata": Mutation(policy={"detached_capture_metadata": ("drafter",)}),
    "hidden-states-not-copied": Mutation(("proposer",), m.HiddenStatesNotCopied),
    "graph-one-size-up": Mutation(("executor",), r.GraphOneSizeUp),
    "silent-eager-fallback": Mutation(("executor",), r.SilentEagerFallback),
    "seq-lens-reallocated": Mutation(("target_builder",), m.SeqLensReallocated),
    "input-ids-rebound": Mutation(("target_builder",), m.InputIdsRebound),
    "sampler-offset-frozen": Mutation(("proposer",), m.SamplerOffsetByHostStep),
    "sampler-offset-advanced": Mutation(("proposer",), m.SamplerOffsetAdvancedInForward),
    "logits-read-next-step": Mutation(("records",), m.LogitsReadNextStep),
    "query-start-loc-one-short": Mutation(("proposer",), m.QueryStartLocOneShort),
    "seq-lens-from-tail": Mutation(BUILDERS, m.SeqLensFromTail),
    "padded-slots-reused": Mutation(BUILDERS, m.PaddedSlotsReused),
    "draft-bound-batch-min": Mutation(("proposer",), m.DraftBoundBatchMin),
    "graph-key-ignores-phase": Mutation(("executor",), r.GraphKeyIgnoresPhase),
    "logits-item-in-capture": Mutation(("target_runner",), m.LogitsOfLiveTokens),
    "mtp-layer-index-frozen": Mutation(("proposer",), m.MtpLayerIndexFrozen),
    "mtp-padded-rows-not-skipped": Mutation(("proposer",), m.MtpPaddedRowsNotSkipped),
    "tree-mask-rebuilt": Mutation(BUILDERS, t.TreeMaskRebuilt),
    "tree-padding-attends-live": Mutation(("drafter_builder",), t.TreePaddingAttendsLive),
    "tree-buffer-without-topk": Mutation(("proposer",), t.TreeBuffersWithoutTopk),
    "tp-seq-lens-rank0-only": Mutation(("target_builder",), tp.SeqLensRefreshedOnRankZero),
    "tp-rank-pads-up": Mutation(("executor",), tp.OneRankPadsUp),
    "tp-rank-stalls": Mutation(("executor",), tp.OneRankStalls),
    "tp-all-reduce-buffer-rebound": Mutation(("executor",), tp.RegisteredBufferRebound),
    "tp-workspace-reallocated": Mutation(("executor",), tp.WorkspaceReallocatedBetweenCaptures),
    "padded-state-rows-slot-zero": Mutation(("target_builder",), h.PaddedStateRowsSlotZero),
    "state-index-from-tail": Mutation(("target_builder",), h.StateIndexFromTail),
    "spec-state-into-null-block": Mutation(("target_builder",), h.SpecStateIntoNullBlock),
    "state-padded-to-token-count": Mutation(("target_builder",), h.StatePaddedToTokenCount),
    "rows-freed-before-readback": Mutation(("stager",), o.RowsFreedBeforeReadback),
    "count-copied-without-wait": Mutation(("stager",), o.CountCopiedWithoutWait),
    "staging-rewritten-early": Mutation(("stager",), o.StagingRewrittenEarly),
    "block-table-stride-drift": Mutation(BUILDERS, lay.BlockTableColumnMajor),
}


def apply(names, parts: EngineParts = EngineParts(),
          policy: CapturePolicy = CapturePolicy()) -> tuple[EngineParts, CapturePolicy]:
    """`parts` and `policy` with the mutation of every fault in `names` applied, in order."""
    for name in names:
        mutation = MUTATIONS[name]
        for part in mutation.parts:
            if part == "executor":
                policy = dataclasses.replace(policy, executor=_stack(mutation.mixin, policy.executor))
            else:
                parts = parts.replace(**{part: _stack(mutation.mixin, getattr(parts, part))})
        if mutation.policy:
            policy = dataclasses.replace(policy, **mutation.policy)
    return parts, policy


@functools.cache
def _stack(mixin: type, base: type) -> type:
    """`mixin` over `base`, one class per pair. It pickles as the call that makes it (`_metaclass`), so the
    parts of a run with injected faults reach its worker processes and the run stays concurrent."""
    return _metaclass(type(base))(f"{mixin.__name__}{base.__name__}", (mixin, base), {})


@functools.cache
def _metaclass(meta: type) -> type:
    """`meta` whose classes pickle as `_stack(*bases)` (copyreg: a class of a custom metaclass otherwise pickles
    by name, and a class made at run time has no name a worker can import)."""
    stacked = type(f"Stacked{meta.__name__}", (meta,), {})
    copyreg.pickle(stacked, lambda cls: (_stack, cls.__bases__))
    return stacked
