"""The bug classes a diagnosis names, each with what it means (DESIGN.md, 'Bug classes')."""

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
NOT_EXERCISED = "NOT_EXERCISED"
UNEXPLAINED = "UNEXPLAINED"
NONE = "NONE"

EXPLAIN = {
    BUFFER_REASSIGNED: "a tensor the graph reads was rebound to a new one; the graph keeps reading the old address",
    STALE_BUFFER: "the captured buffer is at the right address but was not refreshed before replay",
    FROZEN_AT_CAPTURE: "a Python value was baked into the graph at capture",
    PADDING_LEAK: "padded entries were not made inert and leak into real rows",
    PADDING_NUMERICS: "the padded reference departs from eager beyond the dtype's padding-numerics bound, and "
                      "no padded region was isolated: a padding bug the graph and its reference share",
    POOL_ALIAS: "drafter temporaries share a graph pool with live target outputs",
    CAPTURE_CONTEXT: "the graph was captured with other metadata than the one replay refreshes",
    DESCRIPTOR_MISMATCH: "the graph a batch replays was captured for another padded shape of its own phase than the "
                         "one the batch was built for: rows beyond the batch are phantom requests",
    WRONG_GRAPH: "the graph a batch replays was captured for another phase, owner or runtime mode (a graph key that "
                 "ignores a field): another forward's kernels would run; the run stops before the replay",
    CAPTURE_ERROR: "the capture stopped at an op no graph can capture (a host sync such as .item(), .tolist(), "
                   ".cpu() or torch.cuda.synchronize(), or a data-dependent shape), at the named source line",
    OUTPUT_ALIASED: "a graph's output was read after a later replay had overwritten it (held by reference, not copied)",
    SHORT_BUFFER: "a persistent buffer holds fewer entries than a padded batch slices: a short tensor (capacity audit)",
    NOT_EXERCISED: "no forward of the mode replayed a graph: a silent eager fallback proves nothing",
    UNEXPLAINED: "localised, but no one-variable experiment restores parity (see what was ruled out)",
    NONE: "no divergence found",
}
# The classes a bug can be diagnosed as (the others say there is none, or that it is not explained).
BUG_KINDS = (BUFFER_REASSIGNED, STALE_BUFFER, FROZEN_AT_CAPTURE, PADDING_LEAK, PADDING_NUMERICS, POOL_ALIAS, CAPTURE_CONTEXT,
             DESCRIPTOR_MISMATCH, WRONG_GRAPH, OUTPUT_ALIASED, SHORT_BUFFER, CAPTURE_ERROR)
