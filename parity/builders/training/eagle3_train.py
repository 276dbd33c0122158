"""Training of an EAGLE-3 head on a frozen target, by self-distillation with training-time test.

EAGLE-3's recipe, at tiny size:
- features: the target's hidden states entering layers `aux_ids` (for the
  2-layer tiny target (0, 1, 2): the embeddings, the residual stream after
  layer 0, and layer 1's output before the final norm), fused by `fc`;
- draft vocabulary: the `size` most frequent target tokens of the training
  stream, in ascending target-id order (so every d2t offset is >= 0);
- loss: soft cross-entropy against the target's next-token distribution
  restricted to the draft vocabulary (positions whose target argmax has no
  draft id are left out), no feature regression;
- training-time test: the head is unrolled `steps` times. Step j reads, for
  every anchor position p, the token at p+1+j and the head's own step j-1
  output (step 0: the fused target features at p) at position p+j, and attends
  to the step-0 keys of positions <= p plus its own keys of steps 1..j at that
  anchor: exactly what a draft decode step sees in the engine, where step j
  attends to the draft prefill's cache and the earlier draft steps' entries.
Everything is seeded and step-counted; nothing reads the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

from parity.builders.training.train import TrainSettings, fit, frozen_target_params
from parity.models.eagle3 import AUX_IDS_KEY, Eagle3Head

TTT_ATTENTION = "parity_eagle3_ttt"


def draft_vocabulary(stream: torch.Tensor, vocab_size: int, size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(d2t [size] int64, t2d [vocab] bool, fraction of the stream covered) for the `size` most frequent ids."""
    counts = torch.bincount(stream, minlength=vocab_size)
    # NOTE: a stable sort on -count breaks ties by the smaller id, so the choice is reproducible.
    chosen = torch.sort(torch.argsort(-counts, stable=True)[:size]).values
    d2t = chosen - torch.arange(size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d, float(counts[chosen].sum() / counts.sum())


def eagle3_head_config(target: LlamaConfig, draft_vocab: int, aux_ids: tuple[int, ...]) -> LlamaConfig:
    """The head's config: the target's, with one layer, a draft vocabulary and the aux layer ids."""
    config = LlamaConfig.from_dict(target.to_dict())
    config.num_hidden_layers = 1
    config.draft_vocab_size = draft_vocab
    setattr(config, AUX_IDS_KEY, list(aux_ids))
    config._attn_implementation = TTT_ATTENTION
    return config


@torch.no_grad()
def target_aux(model: LlamaForCausalLM, batch: torch.Tensor, aux_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Aux hidden states [B, T, len(aux_ids) * h] (the engine's TargetModel order) and logits [B, T, V]."""
    inner = model.model
    hidden = inner.embed_tokens(batch)
    position_ids = torch.arange(batch.shape[1]).unsqueeze(0).expand(batch.shape[0], -1)
    rope = inner.rotary_emb(hidden, position_ids=position_ids)
    num_layers = model.config.num_hidden_layers
    aux = {}
    for idx, layer in enumerate(inner.layers[:num_layers]):
        aux[idx] = hidden
        hidden = layer(hidden, attention_mask=None, position_ids=position_ids, position_embeddings=rope)
    aux[num_layers] = hidden
    return torch.cat([aux[i] for i in aux_ids], dim=-1), model.lm_head(inner.norm(hidden))


@dataclass
class TTTCache:
    """The keys/values of every unrolled step so far ([B, KVH, n, D] each)."""

    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)


def ttt_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of unrolled step j: step-0 keys of anchors <= p, plus the anchor's own keys of steps 1..j."""
    cache: TTTCache = kwargs["ttt"]
    cache.keys.append(key)
    cache.values.append(value)
    groups = query.shape[1] // key.shape[1]
    keys = [k.repeat_interleave(groups, dim=1) for k in cache.keys]
    values = [v.repeat_interleave(groups, dim=1) for v in cache.values]
    n = query.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
    scores = [(query @ keys[0].transpose(-1, -2) * scaling).masked_fill(~causal, float("-inf"))]
    scores += [(query * k).sum(-1, keepdim=True) * scaling for k in keys[1:]]
    probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(query.dtype)
    out = probs[..., :n] @ values[0]
    for i, v in enumerate(values[1:]):
        out = out + probs[..., n + i:n + i + 1] * v
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(TTT_ATTENTION, ttt_attention)


def ttt_losses(head: Eagle3Head, model: LlamaForCausalLM, batch: torch.Tensor, aux_ids: tuple[int, ...],
               steps: int) -> tuple[list[torch.Tensor], list[float]]:
    """Per unrolled step: the soft cross-entropy and the draft's top-1 agreement with the target."""
    aux, logits = target_aux(model, batch, aux_ids)
    draft_ids = head.lm_head.target_ids()
    in_draft = head.lm_head.t2d[logits.argmax(-1)]                      # [B, T]
    target_probs = torch.softmax(logits[..., draft_ids].float(), dim=-1)  # [B, T, Vd]
    b, t = batch.shape
    n = t - 1                                                            # anchors 0..T-2
    hidden = head.fc(aux[:, :n])
    cache = TTTCache()
    losses, accuracies = [], []
    for j in range(steps):
        # anchor p: token at p+1+j, position p+j; predicts the target's distribution at p+1+j
        tokens = F.pad(batch[:, 1 + j:], (0, j))
        positions = (torch.arange(n) + j).unsqueeze(0).expand(b, -1)
        out = head.layer_forward(head.embed_tokens(tokens), hidden, positions, ttt=cache)
        draft_logp = torch.log_softmax(head.lm_head.proj(head.norm(out)).float(), dim=-1)[:, :n - j]
        probs, mask = target_probs[:, 1 + j:], in_draft[:, 1 + j:].float()
        loss = (-(probs * draft_logp).sum(-1) * mask).sum() / mask.sum().clamp(min=1)
        agree = (draft_logp.argmax(-1) == probs.argmax(-1)).float()
        losses.append(loss)
        accuracies.append(float((agree * mask).sum() / mask.sum().clamp(min=1)))
        hidden = out
    return losses, accuracies


def train_eagle3_head(model: LlamaForCausalLM, stream: torch.Tensor, settings: TrainSettings, draft_vocab: int,
                      aux_ids: tuple[int, ...], ttt_steps: int = 3, step_decay: float = 0.8,
                      progress: Callable[[str], None] | None = None) -> tuple[Eagle3Head, list[list[float]]]:
    """Train an EAGLE-3 head on the frozen `model`; returns it (eval) and per-step (loss..., accuracy...) rows."""
    torch.manual_seed(settings.seed)
    head = Eagle3Head(eagle3_head_config(model.config, draft_vocab, aux_ids)).share(model.model.embed_tokens)
    d2t, t2d, _ = draft_vocabulary(stream, model.config.vocab_size, draft_vocab)
    with torch.no_grad():
        head.lm_head.d2t.copy_(d2t)
        head.lm_head.t2d.copy_(t2d)
        # Start from the target's own output rows and final norm: the head learns to land there.
        head.lm_head.proj.weight.copy_(model.lm_head.weight[head.lm_head.target_ids()])
        head.norm.weight.copy_(model.model.norm.weight)
    params = frozen_target_params(model, head)
    head.train()

    def step_loss(batch):
        losses, accuracies = ttt_losses(head, model, batch, aux_ids, ttt_steps)
        weighted = sum(step_decay ** j * loss for j, loss in enumerate(losses))
        return weighted, [loss.item() for loss in losses] + accuracies

    def report(step, recent):
        mean = [sum(r[i] for r in recent) / len(recent) for i in range(2 * ttt_steps)]
        progress(f"eagle3 head step {step}/{settings.steps} loss " + " / ".join(f"{v:.3f}" for v in mean[:ttt_steps])
                 + " top-1 " + " / ".join(f"{v:.3f}" for v in mean[ttt_steps:]))

    rows = fit(params, stream, settings, step_loss, report if progress else None)
    return head.eval(), rows
