"""parity.audit on examples/gpt_fast: a clean engine gives nothing and computes the same; each planted bug named.

CPU through parity.audit.emulated; the `gpu` twin runs the same checks with torch.cuda.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from examples.gpt_fast import BUGS, Engine, audited_generate

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, MAX_NEW = [5, 9, 17], [8, 5, 2]      # batches of 3, 2, 1: padded to 4, 2, 1
# bug -> (kind, the buffer named first, a graph it must be found in)
EXPECTED = {
    "rebound": ("BUFFER_REASSIGNED", "self.static.tokens", "Engine.decode[4]"),
    "stale": ("STALE_BUFFER", "self.static.positions", "Engine.draft_graph"),
    "frozen": ("FROZEN_AT_CAPTURE", "self.step", "Engine.draft_graph"),
    "padding": ("PADDING_LEAK", "self.static.rows", "Engine.decode[4]"),
    "pool_overwrite": ("POOL_ALIAS", "out", "Engine.decode[4]"),
    "kv_realloc": ("BUFFER_REASSIGNED", "self.target.layers.0.cache.k", "Engine.decode[4]"),
    "output_alias": ("OUTPUT_ALIASED", "out", "Engine.decode[4]"),
}


def check_clean(device: str) -> None:
    tokens, logits = Engine(device, graphs=False).generate(PROMPTS, MAX_NEW)
    session, audited_tokens, audited_logits = audited_generate(lambda: Engine(device), PROMPTS, MAX_NEW)
    assert session.errors == [] and session.findings == []
    assert [a.name for a in session.audits] == ["Engine.decode[4]", "Engine.decode[2]", "Engine.decode[1]",
                                                "Engine.draft_graph"]
    assert all(a.replays > 0 for a in session.audits)
    plain_tokens, plain_logits = Engine(device).generate(PROMPTS, MAX_NEW)
    for t, l in ((audited_tokens, audited_logits), (plain_tokens, plain_logits)):
        assert t == tokens and all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(l, logits))


def check_bug(device: str, bug: str) -> None:
    kind, buffer, graph = EXPECTED[bug]
    session, tokens, logits = audited_generate(lambda: Engine(device, bugs={bug}), PROMPTS, MAX_NEW)
    assert session.errors, f"{bug}: nothing found"
    assert {e.kind for e in session.errors} == {kind}, [e.diagnosis["evidence"] for e in session.errors]
    found = [e for e in session.errors if e.diagnosis["owner"] == graph]
    assert found and found[0].buffers[0] == buffer, [(e.diagnosis["owner"], e.buffers) for e in session.errors]
    if device == "cpu":       # experiments ran; nothing of them remains (CUDA: a freed cache's memory is undefined)
        plain_tokens, plain_logits = Engine(device, bugs={bug}).generate(PROMPTS, MAX_NEW)
        assert tokens == plain_tokens and all(torch.equal(a, b) for a, b in zip(logits, plain_logits))


def test_clean_engine_no_diagnosis_and_the_same_tokens_and_logits_with_and_without_the_audit():
    check_clean("cpu")


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bug_is_named(bug):
    check_bug("cpu", bug)


def test_a_frozen_draft_leaves_the_output_right_so_only_the_audit_sees_it():
    clean, frozen = Engine(), Engine(bugs={"frozen"})
    assert frozen.generate(PROMPTS, MAX_NEW)[0] == clean.generate(PROMPTS, MAX_NEW)[0]
    assert not torch.equal(frozen.history, clean.history)      # the draft's proposals land in column 0


def test_the_glue_is_at_most_ten_lines():
    text = (ROOT / "examples" / "gpt_fast" / "audit.py").read_text()
    glue = re.search(r"# glue:start\n(.*)# glue:end", text, re.S).group(1)
    lines = [line for line in glue.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(lines) <= 10, lines
    assert glue.strip() in (ROOT / "docs" / "audit-quickstart.md").read_text()   # the page shows all of it


@pytest.mark.gpu
def test_clean_engine_on_cuda():
    check_clean("cuda")


# On CUDA the padding bug's padded rows write the cache row a live request writes in the same replay, in one
# kernel: the order is undefined, so the replay can differ from eager by chance. The audit tells that from the
# write's indices before any experiment (parity/audit/padded_writes.py), so the answer is the CPU's.
@pytest.mark.gpu
@pytest.mark.parametrize("bug", BUGS)
def test_planted_bug_is_named_on_cuda(bug):
    check_bug("cuda", bug)
