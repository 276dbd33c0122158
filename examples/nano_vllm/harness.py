"""A tiny random Qwen3 for nano-vllm's ModelRunner, and the decode loop its LLM engine would drive."""

from __future__ import annotations

import sys
import tempfile
from multiprocessing import Event
from pathlib import Path
from types import SimpleNamespace

import torch

UPSTREAM = Path(__file__).parent / "upstream"
# torch.compile's backend for nano-vllm's compiled layers: inductor on a GPU; on the CPU dynamo's "eager" backend
# (compiled regions all the same, without inductor's C++ build, which takes minutes per layer on a CI core).
BACKEND = "inductor" if torch.cuda.is_available() else "eager"
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
            tie_word_embeddings=False, hidden_act="silu", attention_bias=False)


def _import_upstream():
    """nano-vllm's modules; its `@torch.compile` layers get the backend named by `BACKEND` as they are defined."""
    if str(UPSTREAM) not in sys.path:
        sys.path.insert(0, str(UPSTREAM))
    if "nanovllm.engine.model_runner" not in sys.modules:
        from examples.nano_vllm import kernels
        compile_ = torch.compile
        torch.compile = lambda fn=None, **kw: compile_(fn, **{"backend": BACKEND, **kw})
        try:
            kernels.install()
            import nanovllm.engine.model_runner  # noqa: F401 (defines the compiled layers)
        finally:
            torch.compile = compile_
    from nanovllm.engine import model_runner, sequence
    return model_runner, sequence


def runner_class():
    """nano-vllm's ModelRunner class (its source imported from upstream/, kernels stood in where missing)."""
    return _import_upstream()[0].ModelRunner


def _hf_config(dtype: torch.dtype):
    from transformers import Qwen3Config
    config = Qwen3Config(**TINY)
    config.dtype = config.torch_dtype = dtype
    return config


def _weights(folder: Path, dtype: torch.dtype) -> None:
    """Random weights under Hugging Face names (nano-vllm's loader packs q/k/v and gate/up itself)."""
    from safetensors.torch import save_file
    gen, t = torch.Generator().manual_seed(0), TINY
    h, d, kv, inter = t["hidden_size"], t["head_dim"], t["num_key_value_heads"], t["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (t["vocab_size"], h), "model.norm.weight": (h,),
              "lm_head.weight": (t["vocab_size"], h)}
    for i in range(t["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (t["num_attention_heads"] * d, h),
                       p + "self_attn.k_proj.weight": (kv * d, h), p + "self_attn.v_proj.weight": (kv * d, h),
                       p + "self_attn.o_proj.weight": (h, t["num_attention_heads"] * d),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    weights = {name: (torch.randn(shape, generator=gen) / shape[-1] ** 0.5 if len(shape) > 1
                      else 1 + torch.randn(shape, generator=gen) / 8).to(dtype) for name, shape in shapes.items()}
    save_file(weights, str(folder / "model.safetensors"))


def make_runner(cls, folder: Path, dtype: torch.dtype, max_num_seqs: int = 8):
    """nano-vllm's runner on the tiny model: warm-up, KV cache, a graph per batch size in (1, 2, 4, 8)."""
    _weights(folder, dtype)
    config = SimpleNamespace(model=str(folder), max_num_batched_tokens=256, max_num_seqs=max_num_seqs,
                             max_model_len=256, gpu_memory_utilization=0.9, tensor_parallel_size=1,
                             enforce_eager=False, hf_config=_hf_config(dtype), eos=-1, kvcache_block_size=256,
                             num_kvcache_blocks=-1)
    return cls(config, 0, Event())


def decode(runner, prompts: list[list[int]], max_new: list[int]):
    """Prefill, then decode until each request has its tokens: (tokens, logits of every decode step).

    Each request owns one KV block (what the block manager would hand out for short requests); sampling is
    nano-vllm's sampler (temperature 1, seeded), as its engine runs it.
    """
    _, sequence = _import_upstream()
    from nanovllm.utils.context import reset_context
    torch.manual_seed(0)
    seqs = [sequence.Sequence(p) for p in prompts]
    for i, seq in enumerate(seqs):
        seq.block_table, seq.num_scheduled_tokens = [i], len(seq)
    for tok, seq in zip(runner.run(seqs, True), seqs):
        seq.append_token(tok)
    steps = []
    for _ in range(max(max_new) - 1):
        live = [s for s, n in zip(seqs, max_new) if s.num_completion_tokens < n]
        input_ids, positions = runner.prepare_decode(live)
        logits = runner.run_model(input_ids, positions, False)
        steps.append(logits.clone())
        for tok, seq in zip(runner.sampler(logits, runner.prepare_sample(live)).tolist(), live):
            seq.append_token(tok)
        reset_context()
    return [s.completion_token_ids for s in seqs], steps


def workload(padded: bool = True):
    """Requests finishing at different steps. padded: three, decode batches of 3, 2 and 1 (graphs of 4, 2, 1);
    else four, batches of 4, 4, 2, 1, 1 (each a captured size: no padded rows)."""
    if padded:
        return [[5, 9, 17, 3], [40, 2, 11], [7, 7, 30, 1, 22]], [6, 4, 2]
    return [[5, 9, 17, 3], [40, 2, 11], [7, 7, 30, 1, 22], [12, 61]], [6, 4, 3, 3]


def generate(cls=None, dtype=torch.float16, around=None, padded=True, runners=None):
    """Build nano-vllm's runner (class `cls`, default its own) and decode the workload; (tokens, logits).
    float16 as nano-vllm serves (in float32 its sampler writes in place into the inference-mode logits).

    `around`: a context manager entered around the runner's construction and the decode (the audit's glue);
    `runners`: a list the runner is appended to once built (its graphs are captured while it is built).
    """
    import contextlib
    from examples.nano_vllm.platform import platform
    cls = cls or runner_class()
    with tempfile.TemporaryDirectory() as folder, platform(), (around or contextlib.nullcontext()):
        runner = make_runner(cls, Path(folder), dtype)
        if runners is not None:
            runners.append(runner)
        return decode(runner, *workload(padded))
