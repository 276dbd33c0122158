"""measure_overhead: replay medians of a plain graph and audited ones, measured side by side."""

from __future__ import annotations

from parity.audit.bench import DecodeStep, measure_overhead


def test_measure_overhead_reports_three_medians_and_their_ratios():
    result = measure_overhead(iterations=6, make_step=lambda device: DecodeStep(device, batch=2, hidden=32,
                                                                                 layers=1, max_seq=16))
    assert result["backend"] in ("cuda", "emulated") and result["iterations"] == 6
    assert set(result["replay_ms"]) == {"plain", "every_1", "every_16"}
    assert all(ms > 0 for ms in result["replay_ms"].values())
    # A shadow check at every replay runs the step eagerly on top of the replay: never cheaper.
    assert result["overhead"]["every_1"] > 1.0
    assert set(result["overhead"]) == {"every_1", "every_16"}
