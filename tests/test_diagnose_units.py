"""The diagnosis' own logic on hand-made tensors, no engine and no run: output differences,
the padding contract's breaches, the capacity audit's diagnosis. (The stages that drive engines are tested
through whole runs: the mutation matrix and the bug corpus.)"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from parity.diagnose.bisector import short_buffer_diagnosis
from parity.diagnose.repairs import breaches
from parity.diagnose.state import diff_rows, max_diff
from parity.engine.buffers import InputBuffers, register_attention_buffers
from parity.engine.kv_cache import PAD_SLOT
from parity.graphs.descriptor import BatchDescriptor, Dispatch


def test_max_diff_names_what_differs_and_integers_differ_infinitely():
    a = {"logits": torch.zeros(2, 4), "draft_tokens": torch.tensor([1, 2]), "kv0": torch.ones(3)}
    b = {"logits": torch.zeros(2, 4), "draft_tokens": torch.tensor([1, 3]), "kv0": torch.ones(3)}
    b["logits"][1, 2] = 0.25
    worst, names = max_diff(a, b)
    assert worst == math.inf and names == ["logits", "draft_tokens"]
    assert max_diff(a, a) == (0.0, [])


def test_a_nan_on_one_side_only_is_a_divergence_and_on_both_sides_none():
    a = {"logits": torch.tensor([[1.0, 2.0], [float("nan"), 0.0]])}
    b = {"logits": torch.tensor([[1.0, float("nan")], [float("nan"), 0.0]])}
    assert max_diff(a, b) == (math.inf, ["logits"])
    assert diff_rows(a, b) == [0]
    assert max_diff(b, b) == (0.0, [])
    inf = {"logits": torch.tensor([[1.0, float("inf")]])}
    assert max_diff(inf, inf) == (0.0, []) and max_diff(inf, {"logits": torch.tensor([[1.0, 3.0]])})[0] == math.inf


def test_diff_rows_are_the_rows_that_differ():
    a = {"logits": torch.zeros(4, 3)}
    b = {"logits": torch.zeros(4, 3)}
    b["logits"][1, 0], b["logits"][3, 2] = 1e-3, 1.0
    assert diff_rows(a, b) == [1, 3]


def _batch(num_tokens: int, num_reqs: int, tokens_padded: int, reqs_padded: int):
    buffers = InputBuffers("target", torch.device("cpu"))
    register_attention_buffers(buffers, max_tokens=16, max_reqs=4, blocks_per_seq=4)
    dispatch = Dispatch("verify", "full", num_tokens, num_reqs, tokens_padded, reqs_padded,
                        BatchDescriptor(tokens_padded, reqs_padded, True))
    # The padding contract as a correct builder leaves it: PAD slots, zero seq_lens, starts clamped.
    buffers["slot_mapping"][num_tokens:tokens_padded] = PAD_SLOT
    buffers["seq_lens"][num_reqs:reqs_padded] = 0
    buffers["query_start_loc"][num_reqs + 1:reqs_padded + 1] = num_tokens
    return buffers, dispatch


def test_an_inert_contract_has_no_breach():
    buffers, dispatch = _batch(6, 2, 8, 4)
    assert breaches(buffers, SimpleNamespace(), dispatch) == []


def test_a_padded_entry_off_its_pad_value_is_a_breach_named_with_its_count():
    buffers, dispatch = _batch(6, 2, 8, 4)
    buffers["seq_lens"][3] = 17            # a stale row from a larger batch
    buffers["slot_mapping"][7] = 42        # a padded token that would write a live KV slot
    found = {(name, off) for name, _, _, off in breaches(buffers, SimpleNamespace(), dispatch)}
    assert found == {("seq_lens", 1), ("slot_mapping", 1)}


def test_a_breach_in_the_metadata_objects_own_tensor_is_seen_too():
    buffers, dispatch = _batch(6, 2, 8, 4)
    handed_over = buffers["seq_lens"].clone()
    handed_over[2] = 5                     # the metadata object holds a copy whose padding is stale
    found = breaches(buffers, SimpleNamespace(seq_lens=handed_over), dispatch)
    assert [(name, tensor is handed_over, off) for name, tensor, _, off in found] == [("seq_lens", True, 1)]


def test_the_capacity_audit_diagnosis_names_every_short_buffer():
    shortfall = SimpleNamespace(buffer="query_start_loc", owner="drafter", phase="draft_step", runtime_mode="full",
                                num_tokens=8, num_reqs=4, describe=lambda: "query_start_loc holds 4, needs 5")
    diagnosis = short_buffer_diagnosis("full", [shortfall, shortfall])
    assert diagnosis.kind == "SHORT_BUFFER" and diagnosis.buffers == ["query_start_loc"]
    assert diagnosis.owner == "drafter" and diagnosis.step is None and diagnosis.experiment
    assert diagnosis.graph == {"runtime_mode": "full", "num_tokens": 8, "num_reqs": 4}
