"""The ranks' agreement on a bisection's decisions (`graphs.tp_agree`, docs/tp.md): the identity outside TP, the
ranks' common answer under it, and RANK_DIVERGENCE, never a hang, when ranks part.

One process plays rank 0; rank 1's answers are posted into the store the ranks share, as its process would.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch.distributed as dist

from parity.graphs import tp_agree
from parity.graphs.rank_guard import RankDivergence
from parity.graphs.tp_agree import (DecisionsParted, agree_all, agree_any, agree_same, agree_union, first_found,
                                    gather, merged_lines)
from parity.harness.tp_session import run_verdict
from parity.models import tp


def test_outside_tp_every_agreement_is_the_value_itself():
    assert tp.current() is None and not tp_agree.active() and tp_agree.world() == 1
    assert gather("x", {"a": 1}) == [{"a": 1}]
    assert agree_all("x", False) is False and agree_any("x", True) is True
    assert agree_union("x", ["b", "a"]) == ["b", "a"] and agree_same("x", [1, 2]) == [1, 2]
    assert first_found("x", None) == (None, None) and merged_lines("x", ["line"]) == ["line"]
    assert tp_agree.peer_memory() == set()


@pytest.fixture
def rank0(tmp_path):
    """This process as rank 0 of two, and a way to post rank 1's next answer."""
    store = dist.FileStore(str(tmp_path / "store"), 2)
    tp.activate(tp.TpContext(0, 2, timedelta(seconds=1), store=store), None)

    def peer(label: str, value) -> None:
        store.set(f"agree/{tp.current().agreements}/1", json.dumps({"label": label, "value": value}))
    yield peer
    tp.deactivate()


def test_ranks_take_their_common_answer(rank0):
    rank0("forward differs", False)
    assert agree_any("forward differs", False) is False
    rank0("forward differs", True)                 # a bug on rank 1 only shows on rank 1: every rank bisects it
    assert agree_any("forward differs", False) is True
    rank0("parity restored", False)                # restored only where it is restored on every rank
    assert agree_all("parity restored", True) is False
    rank0("repairs", ["seq_lens", "slot_mapping"])    # a repair found on rank 1 is tried on every rank
    assert agree_union("repairs", ["slot_mapping"]) == ["slot_mapping", "seq_lens"]
    rank0("diagnosis", {"kind": "BUFFER_REASSIGNED"})
    assert first_found("diagnosis", None) == ({"kind": "BUFFER_REASSIGNED"}, 1)
    rank0("evidence", ["b"])
    assert merged_lines("evidence", ["a"]) == ["rank 0: a", "rank 1: b"]


def test_ranks_that_part_are_named_not_paired(rank0):
    rank0("host values", ["draft_step"])
    with pytest.raises(DecisionsParted) as differ:      # a value every rank must share, and does not
        agree_same("host values", ["num_reqs"])
    assert differ.value.rank == 1 and "draft_step" in differ.value.found
    rank0("stride: drifted roles", [])                  # rank 1 is at another decision than rank 0
    with pytest.raises(DecisionsParted) as elsewhere:
        agree_any("lockstep: forward differs", True)
    assert elsewhere.value.found == "stride: drifted roles" and "decision 1" in str(elsewhere.value)
    with pytest.raises(DecisionsParted) as stalled:     # rank 1 never posts: named within the timeout
        agree_all("parity restored", True)
    assert stalled.value.rank == 1 and stalled.value.found is None and "stalled" in str(stalled.value)


def test_a_bisection_whose_ranks_part_ends_the_run_as_rank_divergence():
    parted = DecisionsParted(1, 7, "stride: drifted roles", '["a"]', '["b"]', 0)
    assert isinstance(parted, RankDivergence)        # `run_rank` reports it as it reports a parted forward
    summary = run_verdict(2, {0: {"rank": 0, "status": "divergence", **parted.as_dict()},
                              1: {"rank": 1, "status": "divergence", **parted.as_dict()}}, {})
    d = summary["diagnosis"]
    assert summary["verdict"] == "drift" and d["kind"] == "RANK_DIVERGENCE" and d["rank"] == 1
    assert d["descriptors"] == {"rank 0": '["a"]', "rank 1": '["b"]'} and "stride: drifted roles" in d["evidence"][0]


def test_a_repair_found_on_one_rank_is_a_variable_of_every_rank(rank0):
    import torch

    from parity.audit.repairs import Repair, units
    t = torch.zeros(2)
    mine = Repair("STALE_BUFFER", "pos", "registry", "refresh pos", t, slice(None), t)
    theirs = {"kind": "BUFFER_REASSIGNED", "name": "seq_lens", "holder": "registry", "experiment": "redirect seq_lens",
              "tensor": None, "region": None, "value": None, "captured": 1, "live": 2, "note": "rebound"}
    rank0("experiments: repairs", [["BUFFER_REASSIGNED seq_lens (registry)", [theirs]]])
    found = units([mine])
    assert [u.applied for u in found] == [[mine], []], "rank 1's variable is a no-op here, tried all the same"
    assert found[0].told[0].note == " (on rank 0 only)" and found[1].told[0].note == "rebound (on rank 1 only)"
