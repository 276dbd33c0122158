"""Red team (issue 28): graph logits kept by reference past the next replay, on examples/vllm_shaped (FULL).

`_decode` returns the wrapper's weakly held output sliced instead of cloned; every step's kept logits are
read after the run, when later replays of the same graph have overwritten them. Truth (docs/bugs.md):
OUTPUT_ALIASED naming the forward's output: a view kept from an earlier replay of its own graph
(`parity/audit/kept.py`), seen although the runner replays inside `torch.inference_mode()` (whose exit took the
watcher's dispatch keys off: `rearm.Rearm`).
"""

from __future__ import annotations

import pytest
import torch

from examples.vllm_shaped import CUDAGraphMode, ModelRunner
from tests.redteam_vllm import audited


class KeptLogits(ModelRunner):
    def _decode(self, reqs):
        n = len(reqs)
        bs = next(s for s in self.sizes if s >= n)
        self.num_reqs = n
        meta = self.builder.build([r.seq_len for r in reqs], [1] * n, [r.blocks for r in reqs], bs)
        return self._run([r.out[-1] for r in reqs], [r.seq_len - 1 for r in reqs], meta, self.mode, bs)[:n]  # BUG


@pytest.fixture(scope="module")
def outcome():
    # the program reads every kept step at the end, inside the audit
    return audited(KeptLogits, CUDAGraphMode.FULL, reference_class=KeptLogits,
                   read=lambda run: torch.cat([step.clone() for step in run[1]]))


def test_kept_logits_part_from_eager(outcome):
    eager, _, kept = outcome
    assert not torch.equal(kept, torch.cat(eager[1]))


def test_kept_logits_are_named_output_aliased(outcome):
    _, session, _ = outcome
    assert session.errors, "nothing found"
    assert {e.kind for e in session.errors} == {"OUTPUT_ALIASED"}, [e.kind for e in session.errors]
    assert {tuple(e.buffers) for e in session.errors} == {("out",)}, [e.buffers for e in session.errors]
    assert any("its own next replay" in e.diagnosis["evidence"][0] for e in session.errors)
