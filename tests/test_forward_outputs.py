"""Every output a forward produces is compared at that forward: what it returns and every buffer it writes.

A drafter output the lockstep did not compare (the draft probabilities) showed
only where a later forward read it: the next verify's rejection sampler emits
other tokens, and the next draft prefill's inputs differ, blamed on innocent
buffers one step late. Here a drafter writes its draft probabilities at a
column taken from a Python int (baked into a graph at capture) while tokens,
logprobs and gaps go to the right column: only draft_probs is wrong, and the
divergence must be found at the forward that wrote it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parity.diagnose.bisector import bisect_mode
from parity.diagnose.state import outputs
from parity.engine.parts import EngineParts
from parity.engine.proposer import DRAFT_OUTPUTS, SAMPLED_OUTPUTS, EagleProposer
from parity.engine.spec_decode import SpecDecodeEngine
from parity.faults.peek import SeesDraftMeta
from parity.graphs.policy import CapturePolicy
from tests.conftest import engine_config, make_specs, pair_on

SAMPLED = dict(temperature=0.8, seed=5)


def test_each_forward_s_outputs_are_what_it_returns_and_every_buffer_it_writes(random_pair):
    engine = SpecDecodeEngine(*random_pair, engine_config(**SAMPLED))
    seen = {}
    for event in engine.events(make_specs(2, seed=1, max_tokens=4)):
        if event.kind == "post" and event.phase not in seen:
            seen[event.phase] = {**outputs(engine, event), "rows": event.num_rows}
    assert {"logits", "features"} <= set(seen["verify"])
    for phase in ("draft_prefill", "draft_step"):
        assert {"input_ids", "hidden_states", *SAMPLED_OUTPUTS} <= set(seen[phase]), sorted(seen[phase])
    # The draft outputs' columns of this engine step so far: the one each forward writes, and the earlier ones
    # it must leave alone (the later ones still hold the previous step's drafts).
    vocab = random_pair[0].config.vocab_size
    prefill, step = seen["draft_prefill"], seen["draft_step"]
    assert prefill["draft_probs"].shape == (prefill["rows"], 1, vocab)
    assert step["draft_tokens"].shape == (step["rows"], 2) and step["draft_probs"].shape == (step["rows"], 2, vocab)


def test_greedy_drafting_keeps_no_distribution():
    """Greedy acceptance compares tokens: nothing reads a drafted distribution, so none is held or written (at 8B it
    was a [seqs, K, 128256] fp32 buffer, a one-hot fill and a scatter in every draft forward)."""
    from parity.models.pair import load_pair

    pair = load_pair("tiny-llama3-eagle3")
    engine = SpecDecodeEngine(pair.target, pair.head, engine_config())
    drafter = engine.owner("drafter")
    assert "draft_probs" not in drafter.buffers
    assert {name for forward in drafter.forwards() for name, _ in forward.writes} == {
        "input_ids", "hidden_states", *DRAFT_OUTPUTS}
    result = engine.run(make_specs(2, seed=1, max_tokens=4))
    assert len(result.drafts) > 0 and result.drafts["draft_logprob"].notna().all()


class ProbsAtHostColumn(SeesDraftMeta, EagleProposer):
    """The draft probabilities are written again at the column of the host draft step index (right in eager code,
    where it equals the device's; baked at capture in a graph, whose replays overwrite an earlier column)."""

    def _emit(self, n, row_hidden, drafted_positions):
        super()._emit(n, row_hidden, drafted_positions)
        probs = torch.softmax(self.draft_logits(row_hidden) / self.config.temperature, dim=-1)
        self.buffers["draft_probs"][:n, self.forward_meta.draft_step].copy_(probs)


@pytest.mark.parametrize("backend", ["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_divergence_in_draft_probs_alone_is_found_at_the_forward_that_wrote_it(backend, random_pair):
    config = engine_config(**SAMPLED)
    pair, device = pair_on(backend, random_pair)
    make = lambda: SpecDecodeEngine(*pair, config, device, parts=EngineParts(proposer=ProbsAtHostColumn))  # noqa
    scenario = SimpleNamespace(capture_sizes=None, drafter_mode=None)
    found = bisect_mode(make, make_specs(3, seed=1, max_tokens=6), "full", backend, scenario, CapturePolicy())
    # The first draft decode step replays a graph captured at draft step 0: it overwrites column 0's probabilities
    # (the draft prefill's); tokens, logprobs and gaps are right.
    assert (found.step, found.phase, found.draft_step, found.owner) == (0, "draft_step", 1, "drafter"), found
    assert found.kind == "FROZEN_AT_CAPTURE" and found.buffers == ["draft_step"], (found.kind, found.evidence)
    assert found.rows, found.rows

