"""Mutations of the graph runner: mixins over `GraphExecutor`, one step each."""

from __future__ import annotations

from bisect import bisect_right


class SilentEagerFallback:
    """The graph key is built from the dispatch object, not its descriptor: never found, so every
    forward silently runs eagerly (vLLM #23679)."""

    def execute(self, dispatch, fn, meta):
        try:
            return self.replay(self.graphs[(dispatch.phase, dispatch.runtime_mode, dispatch)], meta)
        except KeyError:
            return fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta)


class GraphOneSizeUp:
    """FULL graphs are looked up with bisect_right on the padded size, an off-by-one (vllm-ascend #14510):
    a batch replays the next larger graph, whose extra rows are phantom requests with stale metadata."""

    def entry(self, dispatch):
        if dispatch.runtime_mode != "full":
            return super().entry(dispatch)
        key = (dispatch.phase, dispatch.runtime_mode, dispatch.descriptor)
        same = sorted((k for k in self.graphs if k[:2] == key[:2] and k[2].uniform == key[2].uniform),
                      key=lambda k: k[2].num_tokens)
        sizes = [k[2].num_tokens for k in same]
        i = bisect_right(sizes, dispatch.num_tokens_padded)
        return self.graphs[same[i] if i < len(same) else key]


class GraphKeyIgnoresPhase:
    """Graphs are stored and looked up under their runtime mode and descriptor alone, the phase left out of the
    key: the drafter's prefill and decode step share a key wherever their padded descriptors coincide, so the
    decode step's graph is never captured and the step replays the prefill's graph of the same shape."""

    def graph_key(self, phase, runtime_mode, descriptor):
        return (runtime_mode, descriptor)
