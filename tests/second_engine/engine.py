"""SpecEngine: greedy EAGLE-1 speculative decoding of the tiny pair, graphed by hand.

One step, per batch of requests padded to a capture size:
1. verify: the target runs [last token, K drafts] at positions p..p+K (graph);
2. accept: drafts are kept while they equal the target's argmax, then the
   target's own token (lossless greedy: the output is the target's greedy text);
3. draft: K replays of the draft-step graph propose the next step's drafts;
4. emit: the target logprobs of the emitted tokens are read from the verify
   outputs (after drafting, as an engine that returns logprobs with the step).
Per-step inputs are built fresh; in graph mode they are copied into the
persistent buffers the graphs read (`static_verify`, `static_draft`), one line
per field. The verify forward finds its inputs in a forward context set around
every forward, capture and replay included (as vLLM's `set_forward_context`);
the draft step reads `draft_in`. Graph outputs are held weakly, as vLLM holds
them, so a graph's pool may hand their memory out again.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from tests.second_engine.graphs import capture, graph_api, warm_up, weak_ref
from tests.second_engine.model import draft_forward, new_cache, rope_tables, target_forward

BUGS = ("stale", "reassigned", "frozen", "padding", "pool_alias", "capture_context")
_CONTEXT: list = []


@contextmanager
def forward_context(inputs):
    """The inputs of the forward about to run (or be captured, or replayed), for `get_forward_context`."""
    _CONTEXT.append(inputs)
    try:
        yield
    finally:
        _CONTEXT.pop()


def get_forward_context():
    """The current forward's inputs; None outside any forward."""
    return _CONTEXT[-1] if _CONTEXT else None


@dataclass
class VerifyInputs:
    tokens: torch.Tensor      # [bs, 1 + K] last committed token, then the K drafts
    positions: torch.Tensor   # [bs, 1 + K]
    rows: torch.Tensor        # [bs] cache row per request; padded rows: the trash row

    def view(self, bs: int) -> "VerifyInputs":
        return VerifyInputs(self.tokens[:bs], self.positions[:bs], self.rows[:bs])


@dataclass
class DraftInputs:
    tokens: torch.Tensor      # [bs] token at `positions`
    hidden: torch.Tensor      # [bs, hidden] feature of the position before
    positions: torch.Tensor   # [bs]
    rows: torch.Tensor        # [bs]
    draft_step: torch.Tensor  # [1] column of draft_tokens this step writes

    def view(self, bs: int) -> "DraftInputs":
        return DraftInputs(self.tokens[:bs], self.hidden[:bs], self.positions[:bs], self.rows[:bs], self.draft_step)


@dataclass
class Request:
    row: int
    prompt: list[int]
    max_new: int
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    last: int = 0                      # last committed token, not yet in the target cache
    position: int = 0                  # its position
    feature: torch.Tensor | None = None   # target hidden of the position before `last`

    @property
    def done(self) -> bool:
        return len(self.out) >= self.max_new


class SpecEngine:
    def __init__(self, target, eagle, *, k: int = 3, max_seq: int = 64, capture_sizes=(1, 2, 4),
                 graphs: bool = True, bugs=()):
        unknown = set(bugs) - set(BUGS)
        if unknown:
            raise ValueError(f"unknown bugs {sorted(unknown)}; known: {BUGS}")
        self.t, self.e, self.k, self.bugs = target, eagle, k, frozenset(bugs)
        self.sizes = sorted(capture_sizes)
        max_batch, device, c = self.sizes[-1], target.embed.device, target.config
        self.device, self.trash = device, max_batch
        self.rope = rope_tables(c, max_seq, device)
        self.target_cache = new_cache(c, c.layers, max_batch + 1, max_seq, device)
        self.draft_cache = new_cache(c, 1, max_batch + 1, max_seq, device)
        zeros = lambda *shape: torch.zeros(shape, dtype=torch.long, device=device)  # noqa: E731
        trash = torch.full((max_batch,), self.trash, device=device)
        self.static_verify = VerifyInputs(zeros(max_batch, k + 1), zeros(max_batch, k + 1), trash.clone())
        self.static_draft = DraftInputs(zeros(max_batch), torch.zeros(max_batch, c.hidden, device=device),
                                        zeros(max_batch), trash.clone(), zeros(1))
        self.draft_tokens = zeros(max_batch, k)     # the draft step writes its token at column draft_step
        self.draft_in = self.static_draft
        self.draft_step = 0
        self.num_valid = 0
        self.accepted_per_position = [0] * k
        self.num_drafts = 0
        self.graphs: dict = {}
        if graphs:
            self._capture_all()

    def bug(self, name: str) -> bool:
        return name in self.bugs

    def persistent_buffers(self) -> dict:
        """The buffers the graphs read, by name (for GraphAudit's static_inputs)."""
        return {"verify": self.static_verify, "draft": self.static_draft}

    # --- graphs ---------------------------------------------------------------------------

    def _capture_all(self) -> None:
        api = graph_api(self.device)
        self.target_pool, self.draft_pool = api.graph_pool_handle(), api.graph_pool_handle()
        draft_pool = self.target_pool if self.bug("pool_alias") else self.draft_pool   # BUG pool_alias
        for bs in reversed(self.sizes):          # largest first: smaller graphs reuse its memory
            inputs = self.static_verify.view(bs)
            if self.bug("capture_context"):      # BUG capture_context: captured on dummy copies, not the buffers
                inputs = VerifyInputs(inputs.tokens.clone(), inputs.positions.clone(), inputs.rows.clone())
            with forward_context(inputs):
                warm_up(api, self.verify_forward, bs)
                graph, out = capture(api, self.target_pool, self.verify_forward, bs)
            self.graphs["verify", bs] = (graph, weak_ref(api, out))
            del out                              # held weakly only: its memory goes back to the pool now
        for bs in reversed(self.sizes):
            self.draft_in, self.draft_step = self.static_draft.view(bs), 0
            warm_up(api, self.draft_forward, bs)
            graph, out = capture(api, draft_pool, self.draft_forward, bs)
            self.graphs["draft", bs] = (graph, weak_ref(api, out))
            del out

    def verify_forward(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Captured body: target logits [bs, 1+K, vocab] and hidden [bs, 1+K, hidden] of the forward context."""
        v = get_forward_context()
        return target_forward(self.t, self.target_cache, v.tokens[:bs], v.positions[:bs], v.rows[:bs], self.rope)

    def draft_forward(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Captured body: one draft step of `draft_in`: (token [bs], draft hidden [bs, h], logprobs [bs, vocab])."""
        d = self.draft_in
        hidden = draft_forward(self.t, self.e, self.draft_cache, d.tokens[:, None], d.hidden[:, None],
                               d.positions[:, None], d.rows, self.rope)[:, 0]
        logits = hidden @ self.t.lm_head.T
        shift = logits.max() if self.bug("padding") else logits.max(-1, keepdim=True).values   # BUG padding
        logprobs = (logits - shift) - (logits - shift).exp().sum(-1, keepdim=True).log()
        token = logits.argmax(-1)
        if self.bug("frozen"):                   # BUG frozen: a Python int, baked in at capture
            self.draft_tokens[:bs, self.draft_step] = token
        else:
            self.draft_tokens[:bs].scatter_(1, d.draft_step.view(1, 1).expand(bs, 1), token[:, None])
        return token, hidden, logprobs

    # --- one step ---------------------------------------------------------------------------

    def _pad(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def _verify(self, reqs: list[Request], drafts: torch.Tensor):
        n, bs, k = len(reqs), self._pad(len(reqs)), self.k
        tokens = torch.zeros(bs, k + 1, dtype=torch.long, device=self.device)
        positions = torch.zeros_like(tokens)
        rows = torch.full((bs,), self.trash, device=self.device)
        tokens[:n, 0] = torch.tensor([r.last for r in reqs])
        tokens[:n, 1:] = drafts
        positions[:n] = torch.tensor([r.position for r in reqs])[:, None] + torch.arange(k + 1)
        rows[:n] = torch.tensor([r.row for r in reqs])
        self.num_valid = n
        if not self.graphs:
            with forward_context(VerifyInputs(tokens, positions, rows)):
                return self.verify_forward(bs)
        s = self.static_verify
        s.tokens[:bs].copy_(tokens)
        s.positions[:bs].copy_(positions)
        s.rows[:bs].copy_(rows)
        graph, out = self.graphs["verify", bs]
        with forward_context(s.view(bs)):
            graph.replay()
        return out

    def _draft_step(self, d: DraftInputs, bs: int):
        if not self.graphs:
            return self.draft_forward(bs)
        s = self.static_draft
        s.tokens[:bs].copy_(d.tokens)
        s.hidden[:bs].copy_(d.hidden)
        if not self.bug("stale"):                # BUG stale: positions not refreshed before replay
            s.positions[:bs].copy_(d.positions)
        if self.bug("reassigned"):               # BUG reassigned: rebinds the buffer instead of copying into it
            s.rows = d.rows.clone()
        else:
            s.rows[:bs].copy_(d.rows)
        s.draft_step.copy_(d.draft_step)
        graph, out = self.graphs["draft", bs]
        graph.replay()
        return out

    def _drafts(self, reqs: list[Request]) -> torch.Tensor:
        """K draft steps for `reqs`: their drafts [n, K]."""
        n, bs, h = len(reqs), self._pad(len(reqs)), self.t.config.hidden
        tokens = torch.zeros(bs, dtype=torch.long, device=self.device)
        hidden = torch.zeros(bs, h, device=self.device)
        positions = torch.zeros(bs, dtype=torch.long, device=self.device)
        rows = torch.full((bs,), self.trash, device=self.device)
        tokens[:n] = torch.tensor([r.last for r in reqs])
        hidden[:n] = torch.stack([r.feature for r in reqs])
        positions[:n] = torch.tensor([r.position for r in reqs])
        rows[:n] = torch.tensor([r.row for r in reqs])
        self.num_valid = n
        for j in range(self.k):
            d = DraftInputs(tokens, hidden, positions, rows, torch.tensor([j], device=self.device))
            self.draft_in, self.draft_step = d, j
            token, draft_hidden, _ = self._draft_step(d, bs)
            tokens, hidden, positions = token.clone(), draft_hidden.clone(), positions + 1
        return self.draft_tokens[:n].clone()

    def step(self, reqs: list[Request], drafts: torch.Tensor):
        """Verify `drafts`, accept, propose the next drafts, emit; returns (still active, their drafts)."""
        logits, hidden = self._verify(reqs, drafts)
        n, k = len(reqs), self.k
        target = logits[:n].argmax(-1)
        accepted = (drafts == target[:, :k]).int().cumprod(1).sum(1).tolist()
        emitted = []
        for i, (r, a) in enumerate(zip(reqs, accepted)):
            self.num_drafts += 1
            for j in range(a):
                self.accepted_per_position[j] += 1
            new = (drafts[i, :a].tolist() + [int(target[i, a])])[:r.max_new - len(r.out)]
            emitted.append(new)
            r.out += new
            r.last, r.position, r.feature = int(target[i, a]), r.position + a + 1, hidden[i, a].clone()
        active = [r for r in reqs if not r.done]
        next_drafts = self._drafts(active) if active else None
        logprobs = logits[:n].log_softmax(-1)     # read after drafting: the verify outputs must still be live
        for i, (r, new) in enumerate(zip(reqs, emitted)):
            r.logprobs += [float(logprobs[i, j, tok]) for j, tok in enumerate(new)]
        return active, next_drafts

    # --- requests -------------------------------------------------------------------------

    @torch.no_grad()
    def _prefill(self, r: Request) -> None:
        """Eager: the prompt into the target cache, the first token, and the draft cache for the prompt."""
        tokens = torch.tensor([r.prompt], device=self.device)
        positions = torch.arange(len(r.prompt), device=self.device)[None]
        rows = torch.tensor([r.row], device=self.device)
        logits, hidden = target_forward(self.t, self.target_cache, tokens, positions, rows, self.rope)
        first = int(logits[0, -1].argmax())
        r.out, r.logprobs = [first], [float(logits[0, -1].log_softmax(-1)[first])]
        r.last, r.position, r.feature = first, len(r.prompt), hidden[0, -1].clone()
        features = torch.cat((torch.zeros_like(hidden[:, :1]), hidden[:, :-1]), dim=1)
        draft_forward(self.t, self.e, self.draft_cache, tokens, features, positions, rows, self.rope)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new: list[int]) -> list[Request]:
        """Greedy speculative decoding of `prompts` (one cache row each), `max_new[i]` tokens for request i."""
        reqs = [Request(i, list(p), m) for i, (p, m) in enumerate(zip(prompts, max_new))]
        for r in reqs:
            self._prefill(r)
        active = [r for r in reqs if not r.done]
        drafts = self._drafts(active) if active else None
        while active:
            active, drafts = self.step(active, drafts)
        return reqs

    @torch.no_grad()
    def greedy_reference(self, prompt: list[int], max_new: int) -> list[int]:
        """Plain greedy decoding, one token per eager forward (the output speculative decoding must equal)."""
        c = self.t.config
        cache = new_cache(c, c.layers, 1, self.rope[0].shape[0], self.device)
        rows, out = torch.zeros(1, dtype=torch.long, device=self.device), []
        tokens = torch.tensor([prompt], device=self.device)
        positions = torch.arange(len(prompt), device=self.device)[None]
        while len(out) < max_new:
            logits, _ = target_forward(self.t, cache, tokens, positions, rows, self.rope)
            out.append(int(logits[0, -1].argmax()))
            tokens, positions = torch.tensor([[out[-1]]], device=self.device), positions[:, -1:] + 1
        return out
