"""Layer probes: where a divergent forward's difference starts, decoder layer by decoder layer.

The forward is re-run eagerly in both engines from their pre-forward state. A
first layer that differs means the state the forward starts from already
differs there; no layer differing means the inputs are right and the
difference is made inside the captured graph's replay.
"""

from __future__ import annotations

from parity.diagnose.lab import Divergence
from parity.audit.state import delta


def probe_layers(lab: Divergence) -> list[str]:
    ours = _layer_outputs(lab, "graph")
    theirs = _layer_outputs(lab, "ref")
    if not ours or len(ours) != len(theirs):
        return [f"layer probe: nothing to compare layer by layer (re-run eagerly, the forward ran {len(ours)} decoder "
                f"layer(s) in the graph run and {len(theirs)} in the reference)"]
    t = lab.dispatch.num_tokens
    for i, (a, b) in enumerate(zip(ours, theirs)):
        apart = max(float(delta(x[:t], y[:t]).max()) for x, y in zip(a, b))
        if apart > 0:
            return [f"layer probe: decoder layer {i} is the first to differ ({apart:.3g}) when the forward "
                    "re-runs eagerly from each run's state: the state before this forward already differs"]
    return [f"layer probe: all {len(ours)} decoder layer(s) agree when the forward re-runs eagerly from the "
            "graph run's state: the difference is made inside the captured graph's replay"]


def _layer_outputs(lab: Divergence, run: str) -> list[tuple]:
    """What each decoder layer produced when the forward re-runs eagerly from run `run`'s pre-state."""
    engine, event = lab.side(run)
    lab.restore(run)
    lab.replays += 1
    forward = lab.forward(run)
    return engine.owner(event.owner).layer_outputs(
        lambda: forward(event.dispatch.num_tokens_padded, event.dispatch.num_reqs_padded, event.meta))
