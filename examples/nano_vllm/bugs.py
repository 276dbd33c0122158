"""Planted bugs: nano-vllm's `run_model` with one line changed, as a subclass (the vendored source stays as it is).

- `rebound_slot_mapping`: the slot mapping rebound to a new tensor instead of copied into the graph's
  (the graph keeps reading the one captured);
- `stale_context_lens`: the context lengths never copied in (the graph reads the previous step's);
- `padded_slots`: the padded rows' slots not reset to -1 (a padded row writes the KV cache at a stale slot).
"""

from __future__ import annotations

import torch

BUGS = ("rebound_slot_mapping", "stale_context_lens", "padded_slots")


def buggy_runner(base, bug: str):
    """A subclass of nano-vllm's ModelRunner `base` whose decode replay has `bug`."""
    from nanovllm.utils.context import get_context

    class Buggy(base):
        @torch.inference_mode()
        def run_model(self, input_ids, positions, is_prefill):
            if is_prefill or self.enforce_eager or input_ids.size(0) > 512:
                return super().run_model(input_ids, positions, is_prefill)
            bs, context, graph_vars = input_ids.size(0), get_context(), self.graph_vars
            graph = self.graphs[next(x for x in self.graph_bs if x >= bs)]
            graph_vars["input_ids"][:bs] = input_ids
            graph_vars["positions"][:bs] = positions
            if bug == "rebound_slot_mapping":
                graph_vars["slot_mapping"] = torch.full_like(graph_vars["slot_mapping"], -1)
            elif bug != "padded_slots":
                graph_vars["slot_mapping"].fill_(-1)
            graph_vars["slot_mapping"][:bs] = context.slot_mapping
            if bug != "stale_context_lens":
                graph_vars["context_lens"].zero_()
                graph_vars["context_lens"][:bs] = context.context_lens
            graph_vars["block_tables"][:bs, :context.block_tables.size(1)] = context.block_tables
            graph.replay()
            return self.model.compute_logits(graph_vars["outputs"][:bs])

    Buggy.__name__ = Buggy.__qualname__ = f"ModelRunner_{bug}"
    return Buggy
