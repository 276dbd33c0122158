"""Padded tokens that repeat the last live token's slot race it for the KV write on CUDA, where scatters land in
any order; a random write order on the CPU stands in for that. The forward then does not reproduce itself: the
probe must still name the padded slots (their repair makes it reproduce), on the same answer as sequential
writes give."""

from __future__ import annotations

import torch

import parity.models.paged_attention as paged_attention
from parity.engine.metadata import TOKEN_FIELDS, MetadataBuilder
from parity.harness.request import RunRequest
from parity.harness.session import run_session


def racy_write_kv(k_cache, v_cache, slot_mapping, key, value) -> None:
    order = torch.randperm(key.shape[0], device=key.device)
    rows = paged_attention._cache_rows(k_cache, slot_mapping)[order]
    k_cache.index_copy_(0, rows, key[order])
    v_cache.index_copy_(0, rows, value[order])


def repeat_last(self, name, values, pad, num_tokens):
    inert = self.buffers.spec(name).inert_value(num_tokens)
    filler = values[-1] if values and name in TOKEN_FIELDS else inert
    host = torch.tensor(values + [filler] * pad, dtype=torch.int64)
    self.buffers[name][: len(host)].copy_(host)


def diagnosis(monkeypatch, racy: bool) -> tuple:
    torch.manual_seed(0)     # the race's write orders: the same whatever ran before in this worker
    monkeypatch.setattr(MetadataBuilder, "_fill", repeat_last)
    if racy:
        monkeypatch.setattr(paged_attention, "write_kv", racy_write_kv)
    summary = run_session(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"),
                                     "emulated")).summary
    d = summary["diagnoses"]["full"]
    return summary["modes"]["full"]["verdict"], d["kind"], d["buffers"]


def test_padded_tokens_repeating_a_live_slot_are_named_whether_the_writes_race_or_not(monkeypatch):
    assert diagnosis(monkeypatch, racy=False) == ("drift", "PADDING_LEAK", ["slot_mapping"])
    assert diagnosis(monkeypatch, racy=True) == ("drift", "PADDING_LEAK", ["slot_mapping"])
