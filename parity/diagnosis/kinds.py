"""The kinds a diagnosis names, each with what it means: the one table (DESIGN.md, 'Bug classes').

The bisector, the harness, the audit, the catalog and every renderer import
their kinds and meanings from here; docs/bugs.md ("Which kind a bug is") and
docs/audit.md say the same in more words (tests/test_kinds.py holds them to
every kind here).
"""

from __future__ import annotations

BUFFER_REASSIGNED = "BUFFER_REASSIGNED"
STALE_BUFFER = "STALE_BUFFER"
FROZEN_AT_CAPTURE = "FROZEN_AT_CAPTURE"
PADDING_LEAK = "PADDING_LEAK"
PADDING_NUMERICS = "PADDING_NUMERICS"
POOL_ALIAS = "POOL_ALIAS"
CAPTURE_CONTEXT = "CAPTURE_CONTEXT"
DESCRIPTOR_MISMATCH = "DESCRIPTOR_MISMATCH"
WRONG_GRAPH = "WRONG_GRAPH"
CAPTURE_ERROR = "CAPTURE_ERROR"
OUTPUT_ALIASED = "OUTPUT_ALIASED"
SHORT_BUFFER = "SHORT_BUFFER"
STAGING_RACE = "STAGING_RACE"
NOT_REFRESHED = "NOT_REFRESHED"
NOT_EXERCISED = "NOT_EXERCISED"
RANK_DIVERGENCE = "RANK_DIVERGENCE"
UNEXPLAINED = "UNEXPLAINED"
NONE = "NONE"

MEANING = {
    BUFFER_REASSIGNED: "a tensor the graph reads was rebound to a new one; the graph keeps reading the captured "
                       "address",
    STALE_BUFFER: "the graph reads a persistent buffer at the right address that was not refreshed before replay",
    FROZEN_AT_CAPTURE: "a Python value was baked into the graph at capture",
    PADDING_LEAK: "padded entries were not made inert and leak into real rows",
    PADDING_NUMERICS: "the padded reference departs from eager beyond the dtype's padding-numerics bound, and "
                      "no padded region was isolated: a padding bug the graph and its reference share",
    POOL_ALIAS: "another graph's replay overwrote this graph's output while it was still live (shared pool)",
    CAPTURE_CONTEXT: "the graph baked capture-time state (such as the metadata it was captured with) that a fresh "
                     "capture would not",
    DESCRIPTOR_MISMATCH: "the graph a batch replays was captured for another padded shape of its own phase than the "
                         "one the batch was built for: rows beyond the batch are phantom requests",
    WRONG_GRAPH: "the graph a batch replays was captured for another phase, owner or runtime mode (a graph key that "
                 "ignores a field): another forward's kernels would run; the run stops before the replay",
    CAPTURE_ERROR: "the capture stopped at an op no graph can capture (a host sync such as .item(), .tolist(), "
                   ".cpu() or torch.cuda.synchronize(), or a data-dependent shape), at the named source line",
    OUTPUT_ALIASED: "a graph's output was read after a later replay had overwritten it (held by reference, not copied)",
    SHORT_BUFFER: "a persistent buffer holds fewer entries than a padded batch slices: a short tensor (capacity audit)",
    STAGING_RACE: "an overlapped loop reused a staging buffer (or read-back rows) before the copy or replay that "
                  "reads it completed, or read a buffer before its copy landed: synchronous staging restores parity",
    NOT_REFRESHED: "a static input was never written since capture (a warning: it may be constant)",
    NOT_EXERCISED: "no forward of the mode replayed a graph: a silent eager fallback proves nothing",
    RANK_DIVERGENCE: "tensor-parallel ranks parted before a forward: one dispatched another descriptor (phase, "
                     "runtime mode, padded shape) than rank 0, or never arrived (stalled); the run stops there",
    UNEXPLAINED: "localised, but no one-variable experiment restores parity (see what was ruled out)",
    NONE: "no divergence found",
}
# The classes a bug can be diagnosed as (the others say there is none, that it is not explained, or warn).
BUG_KINDS = (BUFFER_REASSIGNED, STALE_BUFFER, FROZEN_AT_CAPTURE, PADDING_LEAK, PADDING_NUMERICS, POOL_ALIAS, CAPTURE_CONTEXT,
             DESCRIPTOR_MISMATCH, WRONG_GRAPH, OUTPUT_ALIASED, SHORT_BUFFER, CAPTURE_ERROR, RANK_DIVERGENCE,
             STAGING_RACE)
# Suspicions that are not errors by themselves (the panel shows them in yellow, like UNEXPLAINED).
WARNING_KINDS = (NOT_REFRESHED,)
# What a diagnosis' `buffers` name, for the kinds whose names are not buffers.
NAMED = {CAPTURE_ERROR: "source", WRONG_GRAPH: "differs in", DESCRIPTOR_MISMATCH: "differs in",
         RANK_DIVERGENCE: "differs in"}
