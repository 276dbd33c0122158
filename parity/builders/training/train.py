"""Training of the tiny target and its EAGLE-1 head, for a fixed number of steps.

The target is a stock `LlamaForCausalLM` (sdpa attention) trained on packed
stories. The head learns by self-distillation on the target's final-normed
hidden states, EAGLE's recipe: at position i it reads (token x_{i+1}, feature
h_i) and is trained to regress h_{i+1} (smooth L1) and to match the target's
next-token distribution at i+1 through the shared lm_head (soft cross-entropy).
Everything is seeded and step-counted; nothing reads the clock.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from parity.models.eagle1 import Eagle1Head


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    warmup: int = 20
    weight_decay: float = 0.01


def target_config(vocab_size: int, bos_token_id: int, eos_token_id: int) -> LlamaConfig:
    """Llama-3 architecture at tiny size: GQA 4/2 heads of 32, SwiGLU, RMSNorm, rope theta 5e5."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_act="silu",
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=False, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
        initializer_range=0.02)
    config._attn_implementation = "sdpa"
    return config


def head_config(target: LlamaConfig) -> LlamaConfig:
    """The EAGLE-1 head's config: the target's, with one layer."""
    config = LlamaConfig.from_dict(target.to_dict())
    config.num_hidden_layers = 1
    config._attn_implementation = "sdpa"
    return config


def random_windows(stream: torch.Tensor, settings: TrainSettings, step: int) -> torch.Tensor:
    """A [B, T] batch of windows of the token stream; offsets depend only on (seed, step)."""
    gen = torch.Generator().manual_seed(settings.seed * 100_003 + step)
    starts = torch.randint(0, stream.numel() - settings.seq_len, (settings.batch_size,), generator=gen)
    return torch.stack([stream[s:s + settings.seq_len] for s in starts.tolist()])


def _lr_at(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    frac = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _optimizer(params, settings: TrainSettings) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)


def fit(params: list, stream: torch.Tensor, settings: TrainSettings, step_loss: Callable,
        progress: Callable[[int, list], None] | None = None) -> list:
    """AdamW over `params` for `settings.steps` windows of `stream`: warm-up then cosine learning rate, gradients
    clipped at norm 1. `step_loss(batch)` returns (the loss to minimise, the step's record); returns the records,
    and every 25 steps hands `progress` the step count and the last 25 records."""
    opt = _optimizer(params, settings)
    records = []
    for step in range(settings.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, settings)
        loss, record = step_loss(random_windows(stream, settings, step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        records.append(record)
        if progress and (step + 1) % 25 == 0:
            progress(step + 1, records[-25:])
    return records


def frozen_target_params(model: LlamaForCausalLM, head: torch.nn.Module) -> list:
    """Freezes `model` and returns the head's own parameters (those it shares with the target are not trained)."""
    for p in model.parameters():
        p.requires_grad_(False)
    shared = {id(p) for p in model.parameters()}
    return [p for p in head.parameters() if id(p) not in shared]


def train_target(config: LlamaConfig, stream: torch.Tensor, settings: TrainSettings,
                 progress: Callable[[str], None] | None = None) -> tuple[LlamaForCausalLM, list[float]]:
    """Train a fresh `LlamaForCausalLM`; returns it (eval mode) and the loss of every step."""
    torch.manual_seed(settings.seed)
    model = LlamaForCausalLM(config)
    model.train()

    def step_loss(batch):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        return loss, loss.item()

    def report(step, recent):
        progress(f"target step {step}/{settings.steps} loss {sum(recent) / 25:.3f}")

    losses = fit(list(model.parameters()), stream, settings, step_loss, report if progress else None)
    return model.eval(), losses


@torch.no_grad()
def target_features(model: LlamaForCausalLM, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Final-normed hidden states [B, T, h] and logits [B, T, V] of the target."""
    hidden = model.model(input_ids=batch, use_cache=False).last_hidden_state
    return hidden, model.lm_head(hidden)


def head_forward(head: Eagle1Head, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Batched unpaged head forward: [B, T] tokens and [B, T, h] features -> [B, T, h]."""
    embeds = head.embed_tokens(input_ids)
    fused = head.fc(torch.cat((embeds, features.to(embeds.dtype)), dim=-1))
    position_ids = torch.arange(input_ids.shape[1]).unsqueeze(0).expand(input_ids.shape[0], -1)
    rope = head.rotary_emb(fused, position_ids=position_ids)
    return head.layers[0](fused, attention_mask=None, position_ids=position_ids, position_embeddings=rope)


def head_losses(head: Eagle1Head, model: LlamaForCausalLM, batch: torch.Tensor,
                noise: float = 0.0, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(feature smooth-L1, soft cross-entropy against the target) for one batch."""
    hidden, logits = target_features(model, batch)
    features = hidden[:, :-1]
    if noise:
        features = features + (torch.rand(features.shape, generator=gen) * 2 - 1) * noise
    out = head_forward(head, batch[:, 1:], features)
    feature_loss = F.smooth_l1_loss(out, hidden[:, 1:])
    target_probs = torch.softmax(logits[:, 1:].float(), dim=-1)
    draft_logp = torch.log_softmax(head.lm_head(out).float(), dim=-1)
    token_loss = -(target_probs * draft_logp).sum(-1).mean()
    return feature_loss, token_loss


def train_head(model: LlamaForCausalLM, stream: torch.Tensor, settings: TrainSettings,
               token_weight: float = 0.1, noise: float = 0.0,
               progress: Callable[[str], None] | None = None) -> tuple[Eagle1Head, list[tuple[float, float]]]:
    """Train an EAGLE-1 head on the frozen target; returns it and (feature, token) losses per step."""
    torch.manual_seed(settings.seed)
    head = Eagle1Head(head_config(model.config))
    head.share(model.model.embed_tokens, model.lm_head)
    params = frozen_target_params(model, head)
    head.train()
    gen = torch.Generator().manual_seed(settings.seed + 7)

    def step_loss(batch):
        feature_loss, token_loss = head_losses(head, model, batch, noise, gen)
        return feature_loss + token_weight * token_loss, (feature_loss.item(), token_loss.item())

    def report(step, recent):
        progress(f"head step {step}/{settings.steps} feature loss "
                 f"{sum(r[0] for r in recent) / 25:.4f} token loss {sum(r[1] for r in recent) / 25:.3f}")

    losses = fit(params, stream, settings, step_loss, report if progress else None)
    return head.eval(), losses


@torch.no_grad()
def perplexity(model: LlamaForCausalLM, stream: torch.Tensor, seq_len: int = 256) -> float:
    """exp(mean next-token loss) over consecutive windows of `stream`."""
    total, count = 0.0, 0
    for start in range(0, stream.numel() - seq_len, seq_len):
        window = stream[start:start + seq_len].unsqueeze(0)
        total += model(input_ids=window, labels=window, use_cache=False).loss.item() * (seq_len - 1)
        count += seq_len - 1
    return math.exp(total / count)


@contextmanager
def attention_implementation(name: str, *configs: LlamaConfig):
    """Temporarily route the attention of `configs` through `name` (e.g. sdpa for unpaged runs)."""
    saved = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = name
    try:
        yield
    finally:
        for c, old in zip(configs, saved):
            c._attn_implementation = old


def _hf(target) -> LlamaForCausalLM:
    return getattr(target, "hf", target)


@torch.no_grad()
def greedy_with_drafts(target, head: Eagle1Head, prompt: list[int], k: int,
                       max_new_tokens: int) -> tuple[list[int], list[int]]:
    """(greedy continuation, accepted count of every draft) for one prompt.

    Greedy verification is lossless, so the output is the target's greedy
    continuation whatever the head proposes: compute it once, then replay the
    drafting against it. Each draft starts after the target emitted a token:
    the head reads (seq[j+1], h_j) for every verified position j, then chains
    K steps on its own tokens and features.
    """
    model = _hf(target)
    eos = model.config.eos_token_id
    seq = list(prompt)
    while len(seq) < len(prompt) + max_new_tokens + k and seq[-1] != eos:
        hidden = model.model(input_ids=torch.tensor([seq]), use_cache=False).last_hidden_state
        seq.append(int(model.lm_head(hidden[0, -1]).argmax()))
    hidden = model.model(input_ids=torch.tensor([seq]), use_cache=False).last_hidden_state[0]
    accepted_counts = []
    n = len(prompt) + 1  # the prefill emitted the first new token
    while n - len(prompt) < max_new_tokens and n < len(seq) and seq[n - 1] != eos:
        tokens, features, proposal = seq[1:n], hidden[:n - 1], []
        for _ in range(k):
            out = head_forward(head, torch.tensor([tokens]), features.unsqueeze(0))[0, -1]
            draft = int(head.lm_head(out).argmax())
            proposal.append(draft)
            tokens = tokens + [draft]
            features = torch.cat((features, out.unsqueeze(0)))
        accepted = 0
        while accepted < k and n + accepted < len(seq) and proposal[accepted] == seq[n + accepted]:
            accepted += 1
        accepted_counts.append(accepted)
        n += accepted + 1
    return seq[len(prompt):len(prompt) + max_new_tokens], accepted_counts


def distinct_ngram_fraction(tokens: list[int], n: int = 4) -> float:
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def acceptance_report(target, head: Eagle1Head, prompts: list[list[int]], k: int = 3,
                      max_new_tokens: int = 48) -> dict:
    """Per-position greedy acceptance (vLLM definition), mean acceptance length, 4-gram diversity."""
    counts, diversity = [], []
    with attention_implementation("sdpa", _hf(target).config, head.config):
        for prompt in prompts:
            continuation, accepted = greedy_with_drafts(target, head, list(prompt), k, max_new_tokens)
            counts += accepted
            diversity.append(distinct_ngram_fraction(continuation))
    num_drafts = max(1, len(counts))
    rates = [sum(c > i for c in counts) / num_drafts for i in range(k)]
    return {"num_drafts": len(counts), "acceptance_per_position": rates,
            "mean_acceptance_length": 1 + sum(counts) / num_drafts,
            "distinct_4gram_fraction": sum(diversity) / max(1, len(diversity))}


def estimate_acceptance(target, head: Eagle1Head, prompts: list[list[int]], k: int = 3,
                        max_new_tokens: int = 48) -> list[float]:
    """Per-position greedy acceptance rates: fraction of drafts whose first i+1 tokens were accepted."""
    return acceptance_report(target, head, prompts, k, max_new_tokens)["acceptance_per_position"]
