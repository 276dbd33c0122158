"""parity.audit on examples/vllm_shaped: a vLLM-V1-shaped engine, FULL and PIECEWISE, no_grad and inference_mode.

The engine graphs its decode batches through a CUDAGraphWrapper keyed by a
frozen batch descriptor; attention reads its metadata from the forward
context; PIECEWISE graphs the pieces between attention calls and runs
attention eagerly into a `torch.empty` output buffer. The audit attaches
through `examples/vllm_shaped/audit_glue.py` (the lines a user writes) inside
`auto_audit`. CPU through parity.audit.emulated; the same tests on CUDA are
marked gpu.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest
import torch

from examples.vllm_shaped import BUGS, CUDAGraphMode, ModelRunner
from examples.vllm_shaped import audit_glue
from parity.audit import auto_audit

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
GRAPHED = [CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE]
# bug -> (mode it is graded in, kind, a buffer the diagnosis must name, the graph it is found in).
# NOTE: padding_leak is in the FULL graph too, but there its padded rows come from integer inputs
# (token ids), which the padding check poisons only when told to (`padding=`).
EXPECTED = {
    "rebound_seq_lens": (CUDAGraphMode.FULL, "BUFFER_REASSIGNED", "static['buffers'].seq_lens", "model"),
    "stale_slot_mapping": (CUDAGraphMode.FULL, "STALE_BUFFER", "static['buffers'].slot_mapping", "model"),
    "frozen_len": (CUDAGraphMode.FULL, "FROZEN_AT_CAPTURE",
                   "static['forward_context'].attn_metadata['layers.0.attn'].max_seq_len", "model"),
    "padding_leak": (CUDAGraphMode.PIECEWISE, "PADDING_LEAK", "args[0]", "submod_2"),
    "kv_realloc": (CUDAGraphMode.FULL, "BUFFER_REASSIGNED", "self.layers.0.attn.kv_cache", "model"),
}


def workload() -> tuple[list[list[int]], list[int]]:
    """Three requests finishing at different steps: decode batches of 3, 2 and 1 (padded to 4, 2, 1)."""
    rnd = random.Random(0)
    return [[rnd.randrange(64) for _ in range(rnd.randint(3, 8))] for _ in range(3)], [9, 6, 3]


def run(mode, device="cpu", grad="inference_mode", bugs=(), audited=False, **options):
    """(tokens, logits of every step, the session or None)."""
    prompts, max_new = workload()
    if not audited:
        runner = ModelRunner(mode, device=device, grad_mode=GRAD_MODES[grad], bugs=bugs).capture()
        return (*runner.generate(prompts, max_new), None)
    with auto_audit() as session:
        runner = ModelRunner(mode, device=device, grad_mode=GRAD_MODES[grad], bugs=bugs)
        audit_glue.audit(runner, every=1, **options)
        tokens, logits = runner.capture().generate(prompts, max_new)
    session.keyed = [a for w in runner.wrappers() for a in w.runnable.audits.values()]
    return tokens, logits, session


def same(a, b) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad", sorted(GRAD_MODES))
@pytest.mark.parametrize("mode", GRAPHED, ids=lambda m: m.name)
def test_graphs_give_the_eager_tokens_and_logits_bitwise(mode, grad, device):
    assert same(run(mode, device, grad), run(CUDAGraphMode.NONE, device, grad))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad", sorted(GRAD_MODES))
@pytest.mark.parametrize("mode", GRAPHED, ids=lambda m: m.name)
def test_clean_engine_zero_diagnoses_and_the_same_output_audited(mode, grad, device):
    audited = run(mode, device, grad, audited=True, on_mismatch="raise", not_refreshed_after=2)
    session = audited[2]
    assert session.errors == [] and session.findings == []
    graphs_per_size = 1 if mode == CUDAGraphMode.FULL else 3      # the whole forward, or submod_0..2
    assert len(session.keyed) == 3 * graphs_per_size
    assert all(a.replays >= 2 and a.mismatches == 0 for a in session.keyed)
    assert same(audited, run(mode, device, grad))


# Bugs whose graph goes on reading a storage the engine let go of: unaudited on CUDA it reads whatever the
# caching allocator put there since (undefined), while the audit keeps the captured storage alive to name it.
# The emulated pools are deterministic, so the CPU still checks these two computes the same.
READS_FREED_MEMORY = {"rebound_seq_lens", "kv_realloc"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_planted_bug_is_named_and_the_engine_computes_the_same(bug, device):
    mode, kind, buffer, graph = EXPECTED[bug]
    tokens, logits, session = audited = run(mode, device, bugs={bug}, audited=True, on_mismatch="record")
    found = {(e.kind, e.diagnosis["owner"].split("[")[0]) for e in session.errors}
    assert found == {(kind, graph)}, [e.diagnosis["evidence"] for e in session.errors]
    assert all(buffer in e.buffers for e in session.errors), [e.buffers for e in session.errors]
    if not (device == "cuda" and bug in READS_FREED_MEMORY):
        assert same(audited, run(mode, device, bugs={bug}))      # experiments ran; nothing of them remains
    if mode == CUDAGraphMode.FULL:       # attention reads live metadata eagerly between pieces: harmless there
        assert run(CUDAGraphMode.PIECEWISE, device, bugs={bug}, audited=True, on_mismatch="raise")[2].errors == []


def test_every_planted_bug_is_graded():
    assert set(EXPECTED) == set(BUGS)


def test_the_glue_a_user_writes_is_at_most_ten_lines():
    source = Path(audit_glue.__file__).read_text()
    docstrings = {node.body[0].lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, (ast.Module, ast.FunctionDef)) and isinstance(node.body[0], ast.Expr)}
    code = [line for i, line in enumerate(source.splitlines(), 1)
            if line.strip() and not line.strip().startswith("#") and i not in docstrings]
    assert len(code) <= 10, code


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", GRAPHED, ids=lambda m: m.name)
def test_auto_audit_names_each_graph_by_its_wrapper_and_descriptor(mode, device):
    # No glue: each graph is found in its wrapper's per-descriptor entry and named by where the wrapper is kept.
    with auto_audit(on_mismatch="raise") as session:
        ModelRunner(mode, device=device).capture().generate(*workload())
    owner = "ModelRunner.forward" if mode == CUDAGraphMode.FULL else "Model.pieces[{}]"
    pieces = [0] if mode == CUDAGraphMode.FULL else [0, 1, 2]
    assert [a.name for a in session.audits] == [f"{owner.format(i)}[num_tokens={n}]" for n in (4, 2, 1)
                                                for i in pieces]
    assert session.errors == [] and all(a.replays > 0 for a in session.audits)
