"""The engine's tests: speculative decoding must reproduce the target's greedy output."""


PROMPTS = [[17, 250, 31, 88, 402], [5, 9, 300, 12], [44, 45, 46, 47, 48, 49]]


def test_speculative_output_is_the_greedy_output(engine):
    requests = engine.generate(PROMPTS, [10, 7, 4])
    assert [r.out for r in requests] == [engine.greedy_reference(p, n) for p, n in zip(PROMPTS, [10, 7, 4])]


def test_single_request(engine):
    (request,) = engine.generate(PROMPTS[:1], [6])
    assert request.out == engine.greedy_reference(PROMPTS[0], 6)
