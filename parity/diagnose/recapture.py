"""Re-capture under the live context: parity comes back iff the graph baked something in at capture.

What it baked is then narrowed down: metadata tensors the fresh capture reads
and the old one never did (CAPTURE_CONTEXT), or Python values of the metadata,
delta-debugged field by field by re-capturing with the captured values of
every field but a subset (FROZEN_AT_CAPTURE). When even a re-capture does not
restore parity, layer probes say where the difference starts, and the verdict
is UNKNOWN: no diagnosis is made for what no experiment isolated.
"""

from __future__ import annotations

import dataclasses

from parity.analysis.kinds import CAPTURE_CONTEXT, FROZEN_AT_CAPTURE, UNKNOWN
from parity.diagnose.probes import probe_layers
from parity.diagnose.state import METADATA_FIELDS, forward_fn, restore
from parity.diagnose.delta_debug import ddmin
from parity.graphs.capture import capture
from parity.graphs.manager import python_fields
from parity.graphs.manifest import build_manifest


def diagnose(bisector, ref, graph, ev_r, ev_g, snaps, out_r, entry, executor, suspects, worst, **where):
    dispatch = ev_g.dispatch
    live_meta = ev_g.meta
    live_fields = python_fields(live_meta)
    fn = forward_fn(graph, ev_g.owner, ev_g.phase)

    def recaptured_matches(meta) -> tuple[bool, object]:
        restore(snaps["graph"])
        pool = executor.backend.new_pool("bisect")
        g = capture(executor.backend, pool, lambda: fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta),
                    piecewise=dispatch.runtime_mode == "piecewise", weak_outputs=False)
        restore(snaps["graph"])
        bisector.replays += 1
        out = g.replay(live_meta)
        return bisector.outputs_match(graph, ev_g, out_r, out[0] if out else None), g

    restored, fresh = recaptured_matches(live_meta)
    if not restored:
        evidence = ["no buffer repair and no re-capture restores parity"]
        if suspects:
            evidence.append("suspects that did not explain it: " + ", ".join(sorted({s.name for s in suspects})))
        evidence += probe_layers(bisector, ref, graph, ev_r, ev_g, snaps)
        return bisector.diagnosis(UNKNOWN, [], ev_g, evidence=evidence, **where)

    old = {e.name for e in entry.manifest}
    new = {e.name for e in build_manifest(fresh.read_storages, executor.registries)}
    missing = sorted((new - old) & set(METADATA_FIELDS))
    if missing:
        return bisector.diagnosis(CAPTURE_CONTEXT, missing, ev_g, evidence=[
            f"the graph never read the live {', '.join(missing)}: it was captured with other metadata tensors",
            "re-capturing under the live forward context restores parity"], **where)

    captured = entry.captured_with
    candidates = sorted(k for k in live_fields if captured.get(k) != live_fields[k])

    def with_live(subset) -> bool:
        hybrid = dataclasses.replace(live_meta, **{k: captured[k] for k in captured if k not in subset})
        return recaptured_matches(hybrid)[0]

    frozen = ddmin(candidates, with_live) if candidates and with_live(candidates) else []
    if not frozen:
        return bisector.diagnosis(FROZEN_AT_CAPTURE, [], ev_g, evidence=[
            "re-capturing under the live context restores parity, but no single Python value of the metadata "
            "explains it"], **where)
    return bisector.diagnosis(FROZEN_AT_CAPTURE, frozen, ev_g, evidence=[
        *(f"{k}: captured {_short(captured.get(k))}, live {_short(live_fields[k])}" for k in frozen),
        f"re-capturing with the live {', '.join(frozen)} restores parity"], **where)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
