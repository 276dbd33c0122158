"""Shared fixtures: a seeded random target + EAGLE-1 pair, request builders, the gpu marker.

The random pair is "draft-friendly": the target's layers are damped so its next
token depends mostly on the current one, and the head's fc passes the token
embedding through, so the head roughly predicts what the target will say.
That gives acceptance around 0.5 / 0.4 / 0.3 per position instead of ~0 for
two unrelated random models, so the multi-token acceptance paths (partial
acceptance, full acceptance + bonus token, rejection at every position) are
all exercised by the engine tests.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from parity.engine.config import EngineConfig
from parity.engine.spec_decode import RequestSpec
from parity.models.eagle1 import Eagle1Head
from parity.models.llama import build_target
from parity.models.paged_attention import ATTN_IMPLEMENTATION

pytest_plugins = ["budget", "modes_left"]

# NOTE: the models are tiny; with several threads each op pays OpenMP start-up and,
# on a busy 2-core machine, spin-wait contention (measured: 23 s vs 0.1 s for the
# same engine run). One thread is faster here and makes the suite's timing stable.
torch.set_num_threads(1)

VOCAB = 97
HIDDEN = 64
SEED = 0
# Damping of the target's residual branches and noise on the head's hidden half
# of fc; chosen (measured) so position-0 acceptance is ~0.5 at K=3.
TARGET_BRANCH_SCALE = 0.6
HEAD_FC_NOISE = 0.01
HEAD_FC_EMBED_GAIN = 50.0   # the embeddings are ~0.02 in size, the target hidden ~1


def tiny_llama_config() -> LlamaConfig:
    """A Llama-3-like config (GQA, RoPE theta 500000, RMSNorm, SwiGLU) at tiny size."""
    return LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       rope_theta=500000.0)


def build_random_pair(seed: int = SEED):
    """(target, head), deterministic for `seed`, on the CPU in fp32."""
    torch.manual_seed(seed)
    cfg = tiny_llama_config()
    target = build_target(cfg)
    head_cfg = LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": 1})
    head_cfg._attn_implementation = ATTN_IMPLEMENTATION
    head = Eagle1Head(head_cfg).share(target.embed_tokens, target.lm_head).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in target.hf.model.layers:
            layer.self_attn.o_proj.weight.mul_(TARGET_BRANCH_SCALE)
            layer.mlp.down_proj.weight.mul_(TARGET_BRANCH_SCALE)
        fc = torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * HEAD_FC_NOISE
        fc[:, :HIDDEN] += HEAD_FC_EMBED_GAIN * torch.eye(HIDDEN)
        head.fc.weight.copy_(fc)
    return target, head


def pair_on(backend: str, random_pair):
    """The random pair and the device its engines run on: the shared CPU pair, or a fresh one on CUDA."""
    if backend == "emulated":
        return random_pair, "cpu"
    target, head = build_random_pair()
    return (target.to("cuda"), head.to("cuda")), "cuda"


@pytest.fixture(scope="session")
def random_pair():
    return build_random_pair()


def hf_reference(target, attn: str = "eager") -> LlamaForCausalLM:
    """transformers' stock LlamaForCausalLM holding the target's weights (no paged attention)."""
    model = LlamaForCausalLM(LlamaConfig(**target.config.to_dict()))
    model.load_state_dict(target.hf.state_dict())
    model.config._attn_implementation = attn
    # NOTE: no EOS: with one, min_new_tokens would mask its logit and change greedy tokens.
    model.generation_config.eos_token_id = None
    return model.eval().to(target.lm_head.weight.device)


@torch.no_grad()
def hf_greedy(model, prompt, max_new_tokens: int) -> list[int]:
    """Exactly `max_new_tokens` greedy tokens from transformers' generate()."""
    ids = torch.tensor([list(prompt)], device=model.lm_head.weight.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def make_specs(n: int, seed: int, max_tokens: int = 12, min_prompt: int = 1, max_prompt: int = 24,
               stagger: int = 1, vocab: int = VOCAB, avoid_prompt_len: int | None = None) -> list[RequestSpec]:
    """`n` requests with varied prompt lengths; request i arrives at step i * stagger (0 = all at once).

    `avoid_prompt_len` keeps every prompt length away from one value (e.g. 1+K, so
    a batch of prefills can never look like a uniform decode batch by its counts).
    """
    rnd = random.Random(seed)
    specs = []
    for i in range(n):
        length = rnd.randint(min_prompt, max_prompt)
        if avoid_prompt_len is not None and length == avoid_prompt_len:
            length = length + 1 if length < max_prompt else length - 1
        prompt = tuple(rnd.randrange(vocab) for _ in range(length))
        specs.append(RequestSpec(req_id=i, prompt=prompt, max_tokens=max_tokens, arrival_step=i * stagger))
    return specs


def engine_config(**overrides) -> EngineConfig:
    """A small engine config; keyword arguments override the defaults."""
    base = dict(num_speculative_tokens=3, max_num_seqs=3, max_num_batched_tokens=64, block_size=4,
                max_model_len=128)
    base.update(overrides)
    return EngineConfig(**base)


def accepted_per_position(result, k: int) -> list[int]:
    """vLLM's num_accepted_tokens_per_pos: counts of accepted drafts at each position."""
    counts = result.drafts.groupby("draft_index").accepted.sum()
    return [int(counts.get(i, 0)) for i in range(k)]


@pytest.fixture(scope="module")
def warm_forked_children():
    """Draw one figure in this worker before a module forks `parity run` children (the mutation matrix, the bug
    corpus): each child inherits matplotlib and its font cache loaded instead of loading them for its acceptance
    PNG (measured: the first PNG of a process costs 0.4 s of CPU, the next 0.1 s)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2), dpi=50)
    FigureCanvasAgg(fig)
    fig.add_subplot(1, 1, 1).set_title("warm")
    fig.tight_layout()
    fig.canvas.draw()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def by_token(result):
    """Emitted tokens in a canonical order, so two runs' frames compare row by row."""
    return result.tokens.sort_values(["req_id", "output_index"]).reset_index(drop=True)


def by_draft(result):
    """Draft records in a canonical order."""
    return result.drafts.sort_values(["step", "req_id", "draft_index"]).reset_index(drop=True)
