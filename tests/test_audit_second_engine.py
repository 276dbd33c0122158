"""parity.audit on the second engine (emulated graphs): each planted bug named with its kind and role.

The engine is hand-graphed with the emulated stand-in of torch.cuda's graph
API; the audit attaches by itself (auto_audit) and runs its own experiments.
"""

from __future__ import annotations

import warnings

import pytest

from parity.audit import DIAGNOSIS_KEYS, GraphParityError
from parity.audit import check as audit_check
from tests.audit_helpers import EXPECTED, audited_run, configure_with_context, matching, workload
from tests.second_engine import SpecEngine, load_pair


@pytest.fixture(scope="module")
def pair():
    return load_pair("cpu")


def test_engine_is_lossless_and_its_graphs_match_eager(pair):
    prompts, max_new = workload()
    eager = SpecEngine(*pair, graphs=False)
    out_eager = eager.generate(prompts, max_new)
    assert [r.out for r in out_eager] == [eager.greedy_reference(p, m) for p, m in zip(prompts, max_new)]
    assert 0 < sum(eager.accepted_per_position) < eager.num_drafts * eager.k   # drafts both hit and miss
    graphed = SpecEngine(*pair)
    out_graphed = graphed.generate(prompts, max_new)
    assert [(r.out, r.logprobs) for r in out_graphed] == [(r.out, r.logprobs) for r in out_eager]


def test_a_frozen_draft_step_leaves_the_output_right_and_only_lowers_acceptance(pair):
    prompts, max_new = workload()
    clean, broken = SpecEngine(*pair), SpecEngine(*pair, bugs={"frozen"})
    outputs = [[r.out for r in engine.generate(prompts, max_new)] for engine in (clean, broken)]
    assert outputs[0] == outputs[1]
    assert sum(broken.accepted_per_position) < sum(clean.accepted_per_position)


def test_clean_engine_raises_nothing(pair):
    session, engine, _ = audited_run(pair, on_mismatch="raise")
    assert len(session.audits) == 6
    assert session.errors == [] and session.findings == []
    assert all(a.replays > 0 for a in session.audits if ", 4)" in a.name or ", 2)" in a.name)


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_planted_bug_is_named(pair, bug):
    kind, role, graph = EXPECTED[bug]
    session, _, _ = audited_run(pair, bugs={bug})
    assert session.errors, f"{bug}: the audit found nothing"
    assert {e.kind for e in session.errors} == {kind}, [e.diagnosis["evidence"] for e in session.errors]
    found = matching(session, kind, role, graph)
    assert found, [(e.diagnosis["owner"], e.buffers) for e in session.errors]
    diagnosis = found[0]
    assert set(DIAGNOSIS_KEYS) <= set(diagnosis) and diagnosis["experiment"]
    assert isinstance(diagnosis["ruled_out"], list)


def test_a_declared_forward_context_turns_capture_context_into_a_named_rebinding(pair):
    """Declared as a static input, the getter is walked: the capture's copies and the live buffers differ."""
    session, _, _ = audited_run(pair, bugs={"capture_context"}, declare=configure_with_context)
    assert session.errors and {e.kind for e in session.errors} == {"BUFFER_REASSIGNED"}
    assert all(any(b.startswith("static['ctx'].") for b in e.buffers) for e in session.errors)


def test_stale_rules_out_the_refreshed_buffers(pair):
    session, _, _ = audited_run(pair, bugs={"stale"})
    diagnosis = matching(session, "STALE_BUFFER", "positions", "('draft', 4)")[0]
    assert diagnosis["captured_address"] != diagnosis["live_address"]
    assert diagnosis["buffers"] == ["self.static_draft.positions"]
    assert {"tokens", "hidden", "rows"} <= {field for line in diagnosis["ruled_out"]
                                           for field in ("tokens", "hidden", "rows") if f"draft_in.{field}" in line}


def test_frozen_names_the_value_and_the_control(pair):
    session, _, _ = audited_run(pair, bugs={"frozen"})
    diagnosis = matching(session, "FROZEN_AT_CAPTURE", "draft_step", "('draft'")[0]
    assert diagnosis["buffers"] == ["self.draft_step"]
    assert any("control" in line for line in diagnosis["ruled_out"])


def test_raise_mode_stops_the_engine_at_the_faulty_replay(pair):
    with pytest.raises(GraphParityError) as caught:
        audited_run(pair, bugs={"stale"}, on_mismatch="raise")
    assert caught.value.kind == "STALE_BUFFER" and "positions" in caught.value.buffers[0]


def test_cheap_checks_fire_without_a_shadow_run(pair, monkeypatch):
    def no_shadow(*args, **kwargs):
        raise AssertionError("a shadow run happened with every=0")
    monkeypatch.setattr(audit_check, "shadow", no_shadow)
    with warnings.catch_warnings(record=True):     # the abandoned buffer is NOT_REFRESHED too
        warnings.simplefilter("always")
        session, _, _ = audited_run(pair, bugs={"reassigned"}, every=0)
    assert {e.kind for e in session.errors} == {"BUFFER_REASSIGNED"}
    diagnosis = session.errors[0].diagnosis
    assert diagnosis["replays"] == 0 and "address check" in diagnosis["experiment"]
    assert any(b.endswith(".rows") for b in diagnosis["buffers"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session, _, _ = audited_run(pair, bugs={"stale"}, every=0)
    assert session.errors == []
    assert {b for f in session.findings if f["kind"] == "NOT_REFRESHED" for b in f["buffers"]} == \
        {"static['draft'].positions"}
    assert any("NOT_REFRESHED" in str(w.message) for w in caught)


def test_every_sixteen_shadow_checks_replays_1_17_33(pair, monkeypatch):
    shadows = []
    real_shadow = audit_check.shadow

    def counting(fn, args, kwargs):
        shadows.append(fn)
        return real_shadow(fn, args, kwargs)
    monkeypatch.setattr(audit_check, "shadow", counting)
    session, _, _ = audited_run(pair, every=16, max_new=[40, 30, 20])
    expected = sum((a.replays + 15) // 16 for a in session.audits)
    assert session.errors == [] and len(shadows) == expected
    assert any(a.replays > 16 for a in session.audits)


def test_the_second_engine_shares_no_code_with_eagle_parity_but_the_audit():
    # It stands for someone else's engine: what it finds, it finds through parity.audit alone.
    import ast
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parent / "second_engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                assert not name.startswith("parity") or name.startswith("parity.audit"), f"{path.name}: {name}"
