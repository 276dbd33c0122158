"""Red team (issue 28): every PIECEWISE piece's output held weakly, on examples/vllm_shaped.

vLLM converts only the last piece's output to weak references inside the capture; here every wrapper does
(`weak_ref_output=True`), so a piece's outputs go back to the shared pool at once and the next piece's
temporaries overwrite them before attention and the next piece read them. Truth (docs/bugs.md): POOL_ALIAS
(a graph's temporaries overwrite another's live outputs). Before the capture-overlap check (`pool.inputs_overwritten`):
PADDING_LEAK(args[1]) at the first padded replay, then CAPTURE_CONTEXT with no buffer.
"""

from __future__ import annotations

import pytest

from examples.vllm_shaped import CUDAGraphMode, ModelRunner
from tests.redteam_vllm import audited, parts


class AllWeak(ModelRunner):
    def __init__(self, mode, **kw):
        super().__init__(mode, **kw)
        for wrapper in self.wrappers():                           # BUG: not only the last piece's
            wrapper.weak_ref_output = True


@pytest.fixture(scope="module")
def outcome():
    return audited(AllWeak, CUDAGraphMode.PIECEWISE)


def test_weak_pieces_part_from_eager(outcome):
    eager, _, graphed = outcome
    assert parts(eager, graphed)


def test_weak_pieces_are_named_pool_alias(outcome):
    _, session, _ = outcome
    assert session.errors, "nothing found"
    assert {e.kind for e in session.errors} == {"POOL_ALIAS"}, [e.kind for e in session.errors]
