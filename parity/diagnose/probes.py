"""Layer probes: where a divergent forward's difference starts, decoder layer by decoder layer.

The forward is re-run eagerly in both engines from their pre-forward state. A
first layer that differs means the state the forward starts from already
differs there; no layer differing means the inputs are right and the
difference is made inside the captured graph's replay.
"""

from __future__ import annotations

import torch

from parity.diagnose.lab import Divergence
from parity.audit.state import delta


def probe_layers(lab: Divergence) -> list[str]:
    ours = _layer_outputs(lab, "graph")
    theirs = _layer_outputs(lab, "ref")
    t = lab.dispatch.num_tokens
    for i, (a, b) in enumerate(zip(ours, theirs)):
        apart = float(delta(a[:t], b[:t]).max())
        if apart > 0:
            return [f"layer probe: decoder layer {i} is the first to differ ({apart:.3g}) when the forward "
                    "re-runs eagerly from each run's state: the state before this forward already differs"]
    return [f"layer probe: all {len(ours)} decoder layer(s) agree when the forward re-runs eagerly from the "
            "graph run's state: the difference is made inside the captured graph's replay"]


def _layer_outputs(lab: Divergence, run: str) -> list[torch.Tensor]:
    engine, event = lab.side(run)
    outputs: list[torch.Tensor] = []
    layers = engine.owner(event.owner).decoder_layers()

    def keep(module, args, out):
        hidden = out[0] if isinstance(out, tuple) else out
        outputs.append(hidden.detach().float().reshape(-1, hidden.shape[-1]).clone())

    hooks = [layer.register_forward_hook(keep) for layer in layers]
    try:
        lab.restore(run)
        lab.replays += 1
        lab.forward(run)(event.dispatch.num_tokens_padded, event.dispatch.num_reqs_padded, event.meta)
    finally:
        for hook in hooks:
            hook.remove()
    return outputs
