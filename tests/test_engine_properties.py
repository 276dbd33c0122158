"""Properties of the eager engine over random batch compositions.

For any mix of requests, prompt lengths, K, block sizes, arrivals and
max_num_seqs: the run finishes, greedy speculative output equals the
no-speculation output, every KV block is back in the free list, and the
draft records are self-consistent (acceptance is a prefix, matches the
target's argmax, and explains the tokens emitted). The draft prefill reads the
verified sequence shifted by one, and a prompt that can never be scheduled is
an error rather than an endless loop.
"""

from __future__ import annotations


from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import VOCAB, engine_config, make_specs
from parity.engine.spec_decode import RequestSpec, RunEvents, SpecDecodeEngine
from parity.graphs.descriptor import EagerExecutor

MAX_MODEL_LEN = 128   # > longest prompt (64) + max_tokens (10) + 2K + 2: never binding


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 8))
    prompts = [tuple(draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=64))) for _ in range(n)]
    arrivals = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    max_tokens = draw(st.lists(st.integers(1, 10), min_size=n, max_size=n))
    specs = [RequestSpec(i, prompts[i], max_tokens[i], arrivals[i]) for i in range(n)]
    k = draw(st.integers(1, 7))
    max_num_seqs = draw(st.integers(1, 8))
    block_size = draw(st.sampled_from([1, 4, 16]))
    return specs, dict(num_speculative_tokens=k, max_num_seqs=max_num_seqs, block_size=block_size,
                       max_num_batched_tokens=max(64, max_num_seqs * (k + 1)), max_model_len=MAX_MODEL_LEN)


def check_draft_records(result, k: int) -> None:
    """Acceptance is a prefix of matches with the target's argmax and explains the emitted tokens."""
    drafts = result.drafts
    counts = drafts.groupby("draft_index").accepted.sum().reindex(range(k), fill_value=0).tolist()
    assert counts == sorted(counts, reverse=True), f"accepted per position must not increase: {counts}"
    tokens = result.tokens.sort_values("output_index")
    last_step = tokens.groupby("req_id").step.max()
    for (step, req_id), group in drafts.groupby(["step", "req_id"]):
        group = group.sort_values("draft_index")
        assert group.draft_index.tolist() == list(range(k))
        n = int(group.num_accepted.iloc[0])
        assert (group.num_accepted == n).all()
        assert group.accepted.tolist() == [j < n for j in range(k)]
        matches = (group.draft_token == group.target_token).tolist()
        leading = next((j for j, m in enumerate(matches) if not m), k)
        assert n == leading, f"step {step} req {req_id}: accepted {n}, leading matches {leading}"
        emitted = tokens[(tokens.req_id == req_id) & (tokens.step == step)].token.tolist()
        # n accepted drafts, then the target's token (or the bonus token), cut at max_tokens.
        if step < last_step[req_id]:
            assert len(emitted) == n + 1
        assert 1 <= len(emitted) <= n + 1
        assert emitted[:n] == group.draft_token.tolist()[: min(n, len(emitted))]
        if len(emitted) > n and n < k:
            assert emitted[n] == group.target_token.iloc[n]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(scenarios())
def test_random_batches_match_no_spec(random_pair, scenario):
    specs, cfg = scenario
    spec_run = SpecDecodeEngine(*random_pair, engine_config(**cfg)).run(specs)
    plain_run = SpecDecodeEngine(*random_pair, engine_config(**cfg, spec_decode=False)).run(specs)

    assert spec_run.outputs == plain_run.outputs
    for s in specs:
        assert len(spec_run.outputs[s.req_id]) == s.max_tokens
    for run in (spec_run, plain_run):
        assert run.free_blocks_at_end == run.total_blocks
    check_draft_records(spec_run, cfg["num_speculative_tokens"])
    # Every request's tokens are recorded once per output index, in order.
    for s in specs:
        rows = spec_run.tokens[spec_run.tokens.req_id == s.req_id].sort_values("output_index")
        assert rows.output_index.tolist() == list(range(s.max_tokens))
        assert rows.token.tolist() == spec_run.outputs[s.req_id]
        assert (rows.position == rows.output_index + len(s.prompt)).all()


def test_blocks_freed_when_max_model_len_binds(random_pair):
    """Requests cut short by max_model_len still finish and free their blocks."""
    specs = make_specs(4, seed=3, max_tokens=40, min_prompt=10, max_prompt=30, stagger=1)
    cfg = engine_config(num_speculative_tokens=4, max_model_len=40, block_size=4)
    result = SpecDecodeEngine(*random_pair, cfg).run(specs)
    plain = SpecDecodeEngine(*random_pair, engine_config(num_speculative_tokens=4, max_model_len=40,
                                                         block_size=4, spec_decode=False)).run(specs)
    assert result.free_blocks_at_end == result.total_blocks
    for s in specs:
        out = result.outputs[s.req_id]
        assert 1 <= len(out) and len(s.prompt) + len(out) <= cfg.max_model_len
        # Speculation stops earlier (it needs room for K drafts) but never changes tokens.
        assert plain.outputs[s.req_id][: len(out)] == out


def test_temperature_sampling_is_deterministic_per_seed(random_pair):
    specs = make_specs(4, seed=5, max_tokens=10, max_prompt=16, stagger=1)
    runs = [SpecDecodeEngine(*random_pair, engine_config(temperature=1.0, seed=seed)).run(specs)
            for seed in (7, 7, 8)]
    same_a, same_b, other = runs
    assert same_a.outputs == same_b.outputs
    assert same_a.drafts.drop(columns=["top5_tokens", "top5_logprobs"]).equals(
        same_b.drafts.drop(columns=["top5_tokens", "top5_logprobs"]))
    assert same_a.tokens.equals(same_b.tokens)
    assert same_a.outputs != other.outputs
    # Sampling at temperature 1 is not greedy decoding.
    greedy = SpecDecodeEngine(*random_pair, engine_config()).run(specs)
    assert greedy.outputs != same_a.outputs
    for run in runs:
        assert run.free_blocks_at_end == run.total_blocks
        counts = run.drafts.groupby("draft_index").accepted.sum().tolist()
        assert counts == sorted(counts, reverse=True)


class DraftPrefillSpy(EagerExecutor):
    """An eager drafter executor that records what every draft prefill reads."""

    def __init__(self, engine_ref: list):
        self.engine_ref = engine_ref
        self.seen = []

    def execute(self, dispatch, fn, meta):
        if dispatch.phase == "draft_prefill":
            b = self.engine_ref[0].owner("drafter").buffers
            t, r = dispatch.num_tokens, dispatch.num_reqs
            self.seen.append({name: b[name][:size].tolist() for name, size in (
                ("input_ids", t), ("positions", t), ("query_start_loc", r + 1), ("req_ids", r),
                ("sample_indices", r))})
        return super().execute(dispatch, fn, meta)


def check_draft_prefill_inputs(pair, specs, cfg) -> None:
    """EAGLE's draft prefill pairs the target hidden at position p with the token at p+1.

    For every row, every token up to the row's sample index (the verified part of
    the query) must read the token that the final sequence holds at position + 1.
    """
    ref: list = []
    spy = DraftPrefillSpy(ref)
    engine = SpecDecodeEngine(*pair, engine_config(**cfg))
    engine.owner("drafter").executor = spy
    ref.append(engine)
    result = engine.run(specs)
    sequences = {s.req_id: list(s.prompt) + result.outputs[s.req_id] for s in specs}
    assert spy.seen
    for n, seen in enumerate(spy.seen):
        qsl = seen["query_start_loc"]
        for row, req_id in enumerate(seen["req_ids"]):
            seq = sequences[req_id]
            assert qsl[row] <= seen["sample_indices"][row] < qsl[row + 1]
            for t in range(qsl[row], seen["sample_indices"][row] + 1):
                p = seen["positions"][t]
                if p + 1 < len(seq):
                    assert seen["input_ids"][t] == seq[p + 1], (
                        f"draft prefill {n}, row {row} (request {req_id}), token {t} at position {p}: "
                        f"reads {seen['input_ids'][t]}, the sequence has {seq[p + 1]} at {p + 1}")


def test_draft_prefill_inputs_after_all_drafts_accepted(random_pair):
    """A row whose K drafts were all accepted must not shift the rows after it.

    Three requests decode together at K=1 (half the drafts are accepted), so a
    draft prefill often follows a row with every draft accepted by another row.
    """
    specs = make_specs(3, seed=2, max_tokens=16, max_prompt=10, stagger=0)
    check_draft_prefill_inputs(random_pair, specs, dict(num_speculative_tokens=1, max_num_seqs=3))


@settings(max_examples=15, deadline=None, derandomize=True)
@given(scenarios())
def test_draft_prefill_reads_verified_tokens_shifted_by_one(random_pair, scenario):
    specs, cfg = scenario
    check_draft_prefill_inputs(random_pair, specs, cfg)



def test_the_loop_returns_its_records(random_pair):
    """`events()` returns the run's records when it ends; `RunEvents` keeps them for a plain `for`."""
    specs = make_specs(3, seed=2, max_tokens=6, max_prompt=12, stagger=1)
    events = RunEvents(SpecDecodeEngine(*random_pair, engine_config()).events(specs))
    assert events.result is None
    kinds = {e.kind for e in events}
    assert kinds == {"pre", "post", "step_end"}
    ran = SpecDecodeEngine(*random_pair, engine_config()).run(specs)
    assert events.result is not None and events.result.outputs == ran.outputs
    assert events.result.num_steps == ran.num_steps and events.result.drafts.equals(ran.drafts)
    assert next(events, None) is None and events.result.outputs == ran.outputs   # ended twice: kept
