"""The vLLM recipe of docs/audit.md, run as written against a stand-in with CUDAGraphWrapper's interface.

The recipe's code is read from the docs (between the vllm-recipe markers) so
the page cannot drift from what is tested. The toy model reads its attention
metadata from the forward context, as a FULL graph does; the planted bug
rebuilds `seq_lens` as a fresh tensor instead of a view of the persistent
buffer. The top-level arguments keep their addresses, so vLLM's own debug
check would see nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests import vllm_standin as vllm

DOCS = Path(__file__).resolve().parents[1] / "docs" / "audit.md"


def recipe() -> dict:
    text = DOCS.read_text()
    block = re.search(r"<!-- vllm-recipe:start -->\s*```python\n(.*?)```\s*<!-- vllm-recipe:end -->", text, re.S)
    namespace: dict = {}
    exec(compile(block.group(1), str(DOCS), "exec"), namespace)
    return namespace


@dataclass
class Metadata:
    seq_lens: torch.Tensor      # [num_reqs]


class ToyModel(torch.nn.Module):
    def __init__(self, device="cpu"):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter(torch.randn(32, 8, generator=gen).to(device), requires_grad=False)
        self.proj = torch.nn.Parameter(torch.randn(8, 8, generator=gen).to(device), requires_grad=False)

    def forward(self, input_ids, positions):
        meta = vllm.get_forward_context().attn_metadata["layers.0"]
        x = self.embed[input_ids] + positions[:, None].float()
        return (x @ self.proj) * meta.seq_lens[:, None].float()


class ToyRunner:
    """Persistent buffers at the largest size; per-step metadata as views of them (or, with the bug, not)."""

    def __init__(self, bug: bool, device: str = "cpu"):
        self.bug = bug
        self.input_ids = torch.zeros(4, dtype=torch.long, device=device)
        self.positions = torch.zeros(4, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(4, dtype=torch.long, device=device)
        graphs = torch.cuda if device == "cuda" else vllm.emulated
        self.model = vllm.CUDAGraphWrapper(ToyModel(device), None, vllm.CUDAGraphMode.FULL, graphs=graphs)

    def warm_up(self):
        """Eager first, as vLLM's profile run: cuBLAS and friends initialise outside any capture."""
        with vllm.set_forward_context({"layers.0": Metadata(self.seq_lens)}, None, vllm.CUDAGraphMode.NONE):
            self.model(self.input_ids, self.positions)
        return self

    def step(self, step: int, bs: int = 4):
        self.input_ids[:bs] = torch.arange(bs, device=self.input_ids.device) + step
        self.positions[:bs] = step
        self.seq_lens[:bs] = step + 1
        seq_lens = (self.seq_lens[:bs] + 0) if self.bug and step > 0 else self.seq_lens[:bs]
        with vllm.set_forward_context({"layers.0": Metadata(seq_lens)}, vllm.BatchDescriptor(bs),
                                      vllm.CUDAGraphMode.FULL):
            return self.model(self.input_ids[:bs], self.positions[:bs])


@pytest.fixture
def audited():
    undo = recipe()["audit_cuda_graph_wrapper"](vllm.CUDAGraphWrapper, vllm.get_forward_context, every=1,
                                                on_mismatch="record")
    yield
    undo()


def test_recipe_audits_each_descriptor_and_names_the_metadata_field(audited, device="cpu"):
    runner = ToyRunner(bug=True, device=device).warm_up()
    for step in range(3):
        runner.step(step, bs=4)
        runner.step(step, bs=2)
    audits = runner.model.parity_audits
    assert set(audits) == {vllm.BatchDescriptor(2), vllm.BatchDescriptor(4)}
    errors = [e for audit in audits.values() for e in audit.errors]
    assert {e.kind for e in errors} == {"BUFFER_REASSIGNED"}
    assert all(e.buffers == ["static['forward_context'].attn_metadata['layers.0'].seq_lens"] for e in errors)


def test_recipe_on_a_clean_runner_returns_the_eager_values(audited, device="cpu"):
    runner = ToyRunner(bug=False, device=device).warm_up()
    outputs = [runner.step(step).clone() for step in range(3)]
    assert all(a.errors == [] and a.replays == 2 for a in runner.model.parity_audits.values())
    with vllm.set_forward_context({"layers.0": Metadata(runner.seq_lens)}, None, vllm.CUDAGraphMode.NONE):
        assert torch.equal(outputs[-1], runner.model.runnable(runner.input_ids, runner.positions))
