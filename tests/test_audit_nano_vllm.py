"""parity.audit on nano-vllm, unmodified (examples/nano_vllm): its own ModelRunner, capture loop and global context.

A tiny random Qwen3 in float16, flash-attn and Triton stood in for by pure torch
(examples/nano_vllm/kernels.py), the CPU through parity.audit.emulated. The
glue is examples/nano_vllm/audit_glue.py. A run costs 30 s to minutes of CPU
(nano-vllm captures four graphs and compiles its layers), so the CPU tests are
marked costly (`make test-costly`, which CI runs after `make test`); the same
tests on CUDA are marked gpu.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "examples/nano_vllm/upstream/nanovllm/engine/model_runner.py"
pytestmark = [pytest.mark.skipif(not SOURCE.exists(), reason="nano-vllm's source is not in the tree"),
              pytest.mark.xdist_group("nano_vllm")]
CPU = pytest.param("cpu", marks=pytest.mark.costly)
DEVICES = [CPU, pytest.param("cuda", marks=pytest.mark.gpu)]
# bug -> (kind, a word the diagnosis's buffers must contain)
EXPECTED = {"stale_context_lens": ("STALE_BUFFER", "context_lens"),
            "rebound_slot_mapping": ("BUFFER_REASSIGNED", "slot_mapping")}


@pytest.fixture(autouse=True)
def no_default_device_left():
    """nano-vllm's runner exits with `torch.set_default_device("cpu")` still set (upstream): a function mode that
    every later tensor factory of this worker would go through. Each test takes it off."""
    yield
    torch.set_default_device(None)


def _run(bug=None, audited=True, padded=False):
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from examples.nano_vllm import generate, runner_class
    from examples.nano_vllm.audit_glue import audited as glue
    from examples.nano_vllm.bugs import buggy_runner
    cls = buggy_runner(runner_class(), bug) if bug else runner_class()
    if not audited:
        return (*generate(cls, padded=padded), None)
    runners: list = []
    with glue(runners) as session:
        tokens, logits = generate(cls, padded=padded, runners=runners)
    return tokens, logits, session


@pytest.mark.parametrize("device", DEVICES)
def test_clean_nano_vllm_gets_no_diagnosis_and_computes_the_same_with_and_without_the_audit(device):
    tokens, logits, _ = _run(audited=False)
    audited_tokens, audited_logits, session = _run()
    assert [a.name for a in session.audits][1:] == ["ModelRunner.graphs[4]", "ModelRunner.graphs[2]",
                                                    "ModelRunner.graphs[1]"]
    assert session.errors == []
    assert tokens == audited_tokens
    assert all(torch.equal(a, b) for a, b in zip(logits, audited_logits)) and len(logits) == len(audited_logits)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_a_planted_bug_in_nano_vllms_replay_is_named(device, bug):
    _, _, session = _run(bug)
    kind, word = EXPECTED[bug]
    found = {(e.kind, tuple(e.buffers)) for e in session.errors}
    assert any(k == kind and any(word in b for b in buffers) for k, buffers in found), found


@pytest.mark.parametrize("device", DEVICES)
def test_a_padded_batch_is_checked_at_the_graphs_shape(device):
    tokens, logits, _ = _run(audited=False, padded=True)
    audited_tokens, audited_logits, session = _run(padded=True)
    assert session.errors == []
    assert all(a.replays > 0 for a in session.audits[1:])
    assert tokens == audited_tokens
    assert all(torch.equal(a, b) for a, b in zip(logits, audited_logits)) and len(logits) == len(audited_logits)


def test_the_glue_is_at_most_ten_lines():
    tree = ast.parse((ROOT / "examples/nano_vllm/audit_glue.py").read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    lines = sum(n.end_lineno - n.lineno + 1 for n in body)
    assert lines <= 10, lines
