"""Oracle: the eager engine's greedy output equals transformers' greedy generate().

Greedy speculative decoding is lossless, so for every K the engine must emit
exactly what `LlamaForCausalLM.generate(do_sample=False)` of the same weights
emits, and exactly what the engine emits with speculation off, even when
prefills join running decodes in mixed batches.
"""

from __future__ import annotations

import pytest

from conftest import engine_config, hf_greedy, hf_reference, make_specs
from parity.engine.spec_decode import SpecDecodeEngine

MAX_TOKENS = 12
# 7 requests, 3 running at most: later arrivals wait for a free seat and are
# prefilled in a batch with the running decodes.
SPECS = make_specs(7, seed=11, max_tokens=MAX_TOKENS, min_prompt=1, max_prompt=24, stagger=1) \
    + make_specs(2, seed=12, max_tokens=MAX_TOKENS, min_prompt=2, max_prompt=9, stagger=0)
SPECS = [s.__class__(i, s.prompt, s.max_tokens, s.arrival_step) for i, s in enumerate(SPECS)]


@pytest.fixture(scope="module")
def hf_outputs(random_pair):
    target, _ = random_pair
    model = hf_reference(target, "eager")
    return {s.req_id: hf_greedy(model, s.prompt, MAX_TOKENS) for s in SPECS}


@pytest.fixture(scope="module")
def no_spec_result(random_pair):
    return SpecDecodeEngine(*random_pair, engine_config(spec_decode=False)).run(SPECS)


def _mixed_verify_batches(result, k: int) -> int:
    """Verify forwards that mix prefills with running decodes (the interesting batches)."""
    f = result.forwards[result.forwards.phase == "verify"]
    return int(((f.num_reqs > 1) & (f.num_tokens != (k + 1) * f.num_reqs)).sum())


def test_no_spec_engine_matches_transformers_generate(no_spec_result, hf_outputs):
    assert no_spec_result.outputs == hf_outputs
    assert all(len(o) == MAX_TOKENS for o in no_spec_result.outputs.values())


@pytest.mark.parametrize("k", range(1, 8))
def test_spec_decode_matches_transformers_generate(random_pair, hf_outputs, no_spec_result, k):
    result = SpecDecodeEngine(*random_pair, engine_config(num_speculative_tokens=k, max_num_seqs=3)).run(SPECS)

    for req_id, expected in hf_outputs.items():
        assert result.outputs[req_id] == expected, f"request {req_id} at K={k}"
    assert result.outputs == no_spec_result.outputs

    # The workload did what it is meant to: prefills joined running decodes, and
    # max_num_seqs held some requests back past their arrival step.
    assert _mixed_verify_batches(result, k) > 0
    first_step = result.tokens.groupby("req_id").step.min()
    assert any(first_step[s.req_id] > s.arrival_step for s in SPECS)
    # Some drafts were accepted and some rejected, so both paths of the verifier ran.
    assert 0 < result.drafts.accepted.sum() < len(result.drafts)

    # The token records agree with the outputs.
    for req_id, output in result.outputs.items():
        rows = result.tokens[result.tokens.req_id == req_id].sort_values("output_index")
        assert rows.output_index.tolist() == list(range(MAX_TOKENS))
        assert rows.token.tolist() == output


def test_sdpa_reference_agrees(random_pair, hf_outputs):
    """The oracle itself does not depend on transformers' attention kernel."""
    model = hf_reference(random_pair[0], "sdpa")
    for s in SPECS[:3]:
        assert hf_greedy(model, s.prompt, MAX_TOKENS) == hf_outputs[s.req_id]
