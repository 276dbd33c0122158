"""The catalog of injectable bugs.

Each fault is a named change to the engine the way a real bug did it
(`seam.py`: a subclass overriding one step of one engine part or of the graph
runner, or a capture-policy value); the engine and the harness receive the
changed parts, never the names: the harness must find a fault the way it finds
a user's bug. `manifests_in` lists the modes where the fault shows on its home
scenario with the embedded pair (the mutation test checks exactly that, and
`parity faults list` prints it); the detector never reads it. Some faults can
show in more modes on other workloads: padding leaks need stale entries that
matter. Pool aliasing needs a drafter temporary to land on a live output,
which is where the allocator puts it: the same on both backends, since the
emulated pools follow the caching allocator's placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from parity.diagnosis.kinds import (BUFFER_REASSIGNED, CAPTURE_CONTEXT, CAPTURE_ERROR, DESCRIPTOR_MISMATCH,
                                   FROZEN_AT_CAPTURE, NOT_EXERCISED, OUTPUT_ALIASED, PADDING_LEAK, POOL_ALIAS,
                                   RANK_DIVERGENCE, SHORT_BUFFER, STAGING_RACE, STALE_BUFFER, WRONG_GRAPH)
from parity.errors import ParityInputError
from parity.faults.mutations import LogitsOfLiveTokens
from parity.graphs.capture_errors import source_of
from parity.graphs.modes import EAGER, MODES

SCENARIOS = Path("scenarios")
GRAPH_MODES = tuple(m for m in MODES if m != EAGER)
FULL_MODES = tuple(m for m in GRAPH_MODES if m.startswith("full"))


@dataclass(frozen=True)
class Fault:
    name: str
    kind: str               # the bug class the diagnosis must name
    buffers: tuple[str, ...]  # what the diagnosis must name
    site: str               # where in the engine it strikes
    seed: str               # the report it comes from
    scenario: str           # the shipped scenario where it shows
    manifests_in: tuple[str, ...]
    description: str
    # The head it needs: "" the embedded tiny-llama3-eagle pair; else a `parity models synth --shape tiny
    # --head ...` pair's arguments (the MTP faults strike only MTP heads)
    head: str = ""
    # The tensor-parallel ranks it needs (`parity run --tp N`): the TP faults strike a rank other than 0
    tp: int = 1
    # More `parity run` arguments it needs (the registered all-reduce: `--tp-all-reduce registered`)
    args: tuple[str, ...] = ()


FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("reassign-seq-lens", BUFFER_REASSIGNED, ("seq_lens",), "MetadataBuilder.write", "000, 002",
          "default", FULL_MODES,
          "the builder rebinds seq_lens to a new tensor instead of copying into the buffer"),
    Fault("reassign-query-start-loc", BUFFER_REASSIGNED, ("query_start_loc",), "MetadataBuilder.write (drafter)",
          "002", "default", FULL_MODES,
          "the drafter's query_start_loc is built into a fresh tensor every step"),
    Fault("stale-slot-mapping", BUFFER_REASSIGNED, ("slot_mapping",), "MetadataBuilder.store_slots", "001",
          "default", FULL_MODES,
          "between draft decode steps the new slots go to a fresh tensor on the metadata object (a reassignment, "
          "seed 001's review): the captured slot_mapping buffer stays stale"),
    Fault("stale-block-table", BUFFER_REASSIGNED, ("block_table",), "MetadataBuilder.store_block_table", "001",
          "default", FULL_MODES,
          "a request's block-table row reaches the buffer only when first seen; eager code reads a fresh table "
          "handed over on the metadata object, so the captured buffer stays stale"),
    Fault("frozen-draft-step", FROZEN_AT_CAPTURE, ("draft_step",), "EagleProposer.draft_column", "001",
          "default", GRAPH_MODES,
          "the draft step index reaches the captured step as a Python int"),
    Fault("frozen-window-state", FROZEN_AT_CAPTURE, ("window_start_host",), "MetadataBuilder.make_view (sliding window)",
          "001", "s001-multistep-draft", ("full", "full_and_piecewise", "full_decode_only"),
          "the sliding-window start (position-dependent builder state) is handed over as Python values"),
    Fault("padded-rows-unmasked", PADDING_LEAK, ("slot_mapping",), "MetadataBuilder.padding", "002",
          "default", GRAPH_MODES,
          "padded rows keep stale entries (num_reqs used where num_reqs_padded is needed)"),
    # Home: default, where a drafter temporary lands on the target's logits in every graph mode. On s004 (its seed's
    # scenario) it has not in piecewise mode since the heads' norms and last residual add became one op each.
    Fault("shared-pool-alias", POOL_ALIAS, ("logits",), "CapturePolicy.shared_drafter_pool", "004",
          "default", GRAPH_MODES,
          "the drafter captures into the target's pool, whose outputs are held weakly"),
    Fault("capture-without-metadata", CAPTURE_CONTEXT, ("query_start_loc", "seq_lens", "slot_mapping",
                                                          "block_table"),
          "CapturePolicy.detached_capture_metadata", "000", "default", FULL_MODES,
          "the drafter's graphs are captured with dummy metadata that replay never refreshes"),
    Fault("hidden-states-not-copied", STALE_BUFFER, ("hidden_states",), "EagleProposer.store_hidden", "001",
          "default", GRAPH_MODES,
          "the draft hidden-state update is left outside the captured step"),
    Fault("graph-one-size-up", DESCRIPTOR_MISMATCH, ("descriptor",), "GraphExecutor.entry",
          "vllm-ascend #14510", "s002-padded-drafter", FULL_MODES,
          "the graph is looked up with bisect_right on the padded size: a batch replays the next larger graph, "
          "whose extra rows are phantom requests with stale metadata"),
    Fault("silent-eager-fallback", NOT_EXERCISED, (), "GraphExecutor.execute", "vLLM #23679", "default",
          GRAPH_MODES, "the graph key is the dispatch object, never found: every forward silently runs eagerly"),
    Fault("seq-lens-reallocated", BUFFER_REASSIGNED, ("seq_lens",), "MetadataBuilder.make_view (target)",
          "vLLM #51994", "default", FULL_MODES,
          "the builder hands out seq_lens.to(torch.int32): a new tensor every build, an orphan in the graph"),
    Fault("input-ids-rebound", BUFFER_REASSIGNED, ("input_ids",), "MetadataBuilder.write (target)", "vLLM #17211",
          "default", GRAPH_MODES,
          "int32 token ids are stored by rebinding the int64 buffer the graph captured instead of copying into it"),
    Fault("sampler-offset-frozen", FROZEN_AT_CAPTURE, ("draft_step",), "EagleProposer.sampling_positions",
          "Megatron-LM #5697", "s005-sampled-drafts", GRAPH_MODES,
          "the draft sampler's random stream is offset by the host draft step: a graph draws the same random "
          "numbers on every replay"),
    Fault("sampler-offset-advanced", FROZEN_AT_CAPTURE, ("rng_offset",), "EagleProposer.sampling_positions",
          "issue 28", "s005-sampled-drafts", GRAPH_MODES,
          "the draft sampler's random stream is offset by a host counter the forward advances itself "
          "(self.rng_offset += 1): a graph replays the offset of its capture and never moves the counter"),
    Fault("logits-read-next-step", OUTPUT_ALIASED, ("logits",), "Records.read_logits", "SGLang #15399",
          "default", GRAPH_MODES,
          "a step's records are completed while the next step runs, from the target's logits held by reference: "
          "the next verify replay has overwritten them"),
    Fault("query-start-loc-one-short", SHORT_BUFFER, ("query_start_loc",), "EagleProposer.__init__ (buffer sizes)",
          "vLLM #50065", "s002-padded-drafter", GRAPH_MODES,
          "the drafter's query_start_loc holds max_num_seqs entries, one short of a batch padded to max_num_seqs "
          "rows (every real batch of the scenario has fewer)"),
    Fault("seq-lens-from-tail", PADDING_LEAK, ("seq_lens",), "MetadataBuilder.make_view (padded batches)",
          "issue 27", "s002-padded-drafter", GRAPH_MODES,
          "a padded batch's seq_lens view starts at the padded row count: live rows take their bounds from the "
          "buffer's tail, left by a larger batch"),
    Fault("padded-slots-reused", PADDING_LEAK, ("slot_mapping",), "MetadataBuilder.write (slot_mapping)",
          "issue 27", "default", GRAPH_MODES,
          "padded tokens keep the slots of an earlier batch instead of PAD: once those blocks are freed and "
          "handed to another request, padded tokens write into KV a live request owns"),
    Fault("draft-bound-batch-min", PADDING_LEAK, ("seq_lens",), "EagleProposer.step_forward",
          "issue 27", "s002-padded-drafter", GRAPH_MODES,
          "draft decode steps bound every row's context by the batch's shortest, reduced on the device over the "
          "padded rows too: a padded row's zero becomes each live row's bound"),
    Fault("graph-key-ignores-phase", WRONG_GRAPH, ("phase",), "GraphExecutor.graph_key", "issue 28",
          "default", ("piecewise",),
          "graphs are keyed by runtime mode and descriptor without the phase: the drafter's decode step replays "
          "the prefill's graph of the same padded shape"),
    Fault("logits-item-in-capture", CAPTURE_ERROR, (source_of(LogitsOfLiveTokens.logits, ".item()"),),
          "TargetRunner.logits", "issue 28", "default", GRAPH_MODES,
          "the target counts its live tokens with .item() on query_start_loc inside the verify forward: a host "
          "sync no graph can capture"),
    Fault("mtp-layer-index-frozen", FROZEN_AT_CAPTURE, ("draft_step",), "EagleProposer.step_index (MTP head)",
          "vLLM #48892", "mtp-multilayer", GRAPH_MODES,
          "a multi-layer MTP head's layer index is the host draft step: each graph is captured once, at step 0, "
          "and replays layer 0 for every later position", head="mtp-deepseek --mtp-layers 3"),
    Fault("mtp-padded-rows-not-skipped", PADDING_LEAK, (),
          "EagleProposer.store_hidden (MTP head)", "TensorRT-LLM #5058", "mtp-deepseek", GRAPH_MODES,
          "the drafter's sampler writes padded rows' samples to the pad slot 0: the last padded row's token and "
          "hidden state become row 0's next draft inputs", head="mtp-deepseek"),
    Fault("tree-mask-rebuilt", BUFFER_REASSIGNED, ("tree_bits",), "MetadataBuilder.write (tree_bits)",
          "issue 30", "eagle-tree", FULL_MODES,
          "tree drafts: the builder writes each batch's tree mask into a fresh tensor; a FULL graph keeps reading "
          "the mask it was captured with"),
    Fault("tree-padding-attends-live", PADDING_LEAK, ("slot_mapping",),
          "MetadataBuilder.frontier_live (tree draft steps)", "SGLang #18647", "eagle-tree", GRAPH_MODES,
          "tree drafts: between draft steps padded frontier rows are advanced like live ones: they attend to the "
          "keys their stale block-table row names and write their own there, into a live request's KV"),
    Fault("tree-buffer-without-topk", SHORT_BUFFER, ("tree_seq", "tree_base", "tree_bits"),
          "EagleProposer.__init__ (tree buffer sizes)", "SGLang #27460", "eagle-tree-wide", FULL_MODES,
          "tree drafts: the drafter's tree metadata is sized for max_num_batched_tokens, without the draft "
          "step's topk factor: a FULL graph of max_num_seqs rows of topk nodes slices past its end"),
    Fault("tp-seq-lens-rank0-only", BUFFER_REASSIGNED, ("seq_lens",), "MetadataBuilder.write (target, rank > 0)",
          "issue 33", "tp-short", FULL_MODES,
          "per-rank metadata refreshed on rank 0 only: the other ranks build seq_lens into a fresh tensor, their "
          "FULL graphs read the captured buffer, and the all-reduce spreads the stale rank's error to every rank",
          tp=2),
    Fault("tp-rank-pads-up", RANK_DIVERGENCE, ("descriptor",), "GraphExecutor.dispatch (rank > 0)", "issue 33",
          "tp-short", GRAPH_MODES,
          "one rank pads its target batches to the next capture size up: its graph and all-reduce have another "
          "shape than its peers' (a deadlock on NCCL); the ranks' descriptor exchange stops the run", tp=2),
    Fault("tp-rank-stalls", RANK_DIVERGENCE, ("descriptor",), "GraphExecutor.execute (rank > 0)", "issue 33",
          "tp-short", GRAPH_MODES,
          "one rank blocks on the host before its third graphed forward: its peers wait for it; the descriptor "
          "exchange times out and names it (stalled), and the launcher ends it", tp=2),
    Fault("tp-all-reduce-buffer-rebound", BUFFER_REASSIGNED, ("model.hf.model.layers.0.self_attn.o_proj.out",),
          "RowParallelLinear.out (re-register path)",
          "issue 33", "tp-registered", GRAPH_MODES,
          "after capture a re-register path gives the first row-parallel layer's registered all-reduce buffer a "
          "fresh slot and rebinds `out` to it: graphs stage the partial product into the buffer they captured while "
          "every rank reads the one now registered (run with --tp 2 --tp-all-reduce registered)", tp=2,
          args=("--tp-all-reduce", "registered")),
    Fault("tp-workspace-reallocated", BUFFER_REASSIGNED, ("model.tp_registered.heap",),
          "GraphExecutor._capture (registered all-reduce)",
          "issue 33", "tp-registered", GRAPH_MODES,
          "the registered all-reduce's workspace is reallocated after the first graph size is captured: every "
          "row-parallel buffer moves, the graph captured first replays against the old workspace (run with --tp 2 "
          "--tp-all-reduce registered)", tp=2,
          args=("--tp-all-reduce", "registered")),
    Fault("padded-state-rows-slot-zero", PADDING_LEAK, ("spec_index",),
          "StateIndexSteps.write_state (hybrid)", "tokenspeed #700, AReno #509", "hybrid", GRAPH_MODES,
          "padded rows' state index is slot 0, not the sentinel: they write their state over the provisional states "
          "of the request holding slot 0", head="eagle1 --hybrid"),
    Fault("state-index-from-tail", PADDING_LEAK, ("state_index",), "StateIndexSteps.state_view (hybrid)",
          "SGLang #32555", "hybrid", GRAPH_MODES,
          "the state-index buffer is refilled at the front but a padded batch reads it through a view of its tail: "
          "live rows start from other slots' states (unpadded eager batches read the front)", head="eagle1 --hybrid"),
    Fault("spec-state-into-null-block", PADDING_LEAK, ("spec_state",), "StateIndexSteps.write_state (hybrid)",
          "intel/llm-scaler #711", "hybrid", GRAPH_MODES,
          "live rows' speculative states go into the shared null block (the sentinel slot); the commit reads what "
          "their own slots held before", head="eagle1 --hybrid"),
    Fault("state-padded-to-token-count", PADDING_LEAK, ("spec_index",),
          "StateIndexSteps.write_state (hybrid)", "vLLM #45100, vllm-ascend #15461", "hybrid", GRAPH_MODES,
          "request-indexed state indices padded from the token count, not the row count: padded rows (fewer "
          "than the batch's tokens) keep slots a larger batch left there", head="eagle1 --hybrid"),
    Fault("rows-freed-before-readback", STAGING_RACE, ("logits",), "Stager.readback (overlapped loop)",
          "SGLang #37988", "overlap", GRAPH_MODES,
          "the event that lets the next verify reuse the logits rows is recorded before the readback copy that still "
          "reads them: the replay rewrites the rows first, and a step's records get the next step's logprobs"),
    Fault("count-copied-without-wait", STAGING_RACE, ("seq_lens",), "Stager.consume (overlapped loop)",
          "vllm-ascend #9456", "overlap", GRAPH_MODES,
          "the per-request token count (seq_lens) is copied on a stream of its own that the verify never waits on: "
          "the forward reads the previous batch's counts"),
    Fault("staging-rewritten-early", STAGING_RACE, ("positions", "slot_mapping", "query_start_loc"),
          "Stager.wait_reusable (overlapped loop)", "issue 34", "overlap", GRAPH_MODES,
          "the host writes the draft decode steps' batch into the staging slots without waiting for the draft "
          "prefill's copies to read them: the prefill reads the steps' positions, slots and query starts"),
    Fault("block-table-stride-drift", BUFFER_REASSIGNED, ("block_table",), "MetadataBuilder.make_view",
          "vLLM #51318, #50046", "default", FULL_MODES,
          "live batches hand the block table as a column-major view of its buffer (pitch: the buffer's capacity); "
          "the capture-time batch handed the row-major one: the same address and shape read at another stride"),
]}


def resolve_faults(names) -> frozenset:
    """Validate fault names (exit 2 on an unknown one) and return them as a set."""
    for name in names:
        if name not in FAULTS:
            raise ParityInputError(f"unknown fault {name!r} (known: {', '.join(FAULTS)})")
    return frozenset(names)


def home_scenario(fault: Fault, scenarios_dir: Path = SCENARIOS) -> Path:
    """The shipped scenario where `fault` shows (`manifests_in` is measured there)."""
    return scenarios_dir / f"{fault.scenario}.yaml"
