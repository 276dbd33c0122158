"""A synthetic pair generated at load on each rank's device: no weight files (`parity models synth --at-load`).

A 70B pair is 140 GB in bf16, more than a 2-GPU box's disk. So `--at-load`
writes only the configs, the tokenizer and a recipe (RECIPE: shape, head,
seed, scale), and each process that loads the pair draws the weights on its
own device, every tensor from the generator of (seed, tensor name) exactly as
`weights.py` draws it (so TP=1 and TP=N hold the same full model), a rank
keeping its slice of each (`models.tp.rank_slice`) and dropping the rest
tensor by tensor: no rank ever holds more than its share plus one tensor.

Not calibrated (the target's forward at 70B does not fit one device): the
o_proj/down_proj `scale` is given (1e-4 gave 83% bigram agreement at 8B, see
DESIGN.md), and the EAGLE-1 head's attention keeps Llama's init instead of
being sized on sample tokens. Acceptance is whatever that gives; the verdicts
(bitwise, per rank) do not depend on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from parity.builders.synth import weights
from parity.builders.synth.build import _config_json
from parity.builders.synth.spec import SHAPES, TARGET_FOLDER, head_config, target_config
from parity.builders.synth.tokenizer import write_tokenizer
from parity.errors import ParityInputError
from parity.models import tp
from parity.models.eagle1 import Eagle1Head
from parity.models.llama import TargetModel, paged_config
from parity.models.pair import RECIPE, ModelPair
from parity.models import loader

DEFAULT_SCALE = 1e-4


def write_recipe(out: Path, shape_name: str, head: str, seed: int, scale: float, dtype: torch.dtype) -> None:
    """target/ and <head>/ folders with config.json (and the tokenizer), the recipe in place of weights."""
    if shape_name not in SHAPES:
        raise ParityInputError(f"unknown shape {shape_name!r}; known shapes: {', '.join(SHAPES)}")
    if head != "eagle1":
        raise ParityInputError(f"--at-load: only --head eagle1 is generated at load, not {head}")
    shape = SHAPES[shape_name]
    recipe = {"shape": shape_name, "head": head, "seed": seed, "scale": scale}
    for folder, raw in ((out / TARGET_FOLDER, target_config(shape)), (out / head, head_config(shape, head))):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(_config_json(raw, dtype), indent=2, sort_keys=True) + "\n")
        (folder / RECIPE).write_text(json.dumps(recipe, indent=2) + "\n")
    write_tokenizer(out / TARGET_FOLDER, shape.vocab_size, shape.max_position_embeddings)


def generate_pair(entry, target_dir: Path, draft_dir: Path, dtype: torch.dtype, device: torch.device) -> ModelPair:
    """The pair a recipe describes, on `device`; in a rank of a TP run, the target is that rank's slices."""
    recipe = json.loads((target_dir / RECIPE).read_text())
    shape = SHAPES[recipe["shape"]]
    target = _target(shape, recipe["seed"], recipe["scale"], dtype, device)
    head = _eagle1(shape, target, recipe["seed"], dtype, device)
    return ModelPair(entry, target.eval(), head.eval(), loader.load_tokenizer(target_dir), target_dir, draft_dir)


@torch.no_grad()
def _target(shape, seed: int, scale: float, dtype: torch.dtype, device: torch.device) -> TargetModel:
    config = paged_config(LlamaConfig.from_dict(target_config(shape)))
    with torch.device("meta"):
        target = TargetModel(LlamaForCausalLM(config))
    full = {name: t.shape for name, t in target.hf.state_dict().items()}
    ctx = tp.current()
    rank, world = (ctx.rank, ctx.world) if ctx is not None else (0, 1)
    if world > 1:
        tp.shard_target(target, rank, world)        # on the meta device: the per-rank shapes, no memory
    frequent = weights.frequent_ids(shape, seed)
    state = {}
    for name, meta in target.hf.state_dict().items():
        if "rotary_emb" in name:
            continue
        whole = weights.target_tensor(name, full[name], shape, seed, scale, frequent, dtype, device)
        state[name] = tp.rank_slice(whole, meta.shape, rank)
        del whole
    target.hf.load_state_dict(state, strict=False, assign=True)
    target.hf.model.rotary_emb = LlamaRotaryEmbedding(target.hf.config).to(device)
    target.tp_sharded = (rank, world)
    return target.fuse_layers().requires_grad_(False)


@torch.no_grad()
def _eagle1(shape, target: TargetModel, seed: int, dtype: torch.dtype, device: torch.device) -> Eagle1Head:
    """The EAGLE-1 head by the recipe of `weights.eagle1_state` but for the attention sizing (module docstring)."""
    config = paged_config(LlamaConfig.from_dict(head_config(shape, "eagle1")))
    with torch.device("meta"):
        head = Eagle1Head(config)
    h = config.hidden_size
    state = {}
    for name, meta in head.head_state_dict().items():
        if name == "fc.weight":
            tensor = weights.normal(meta.shape, weights.HIDDEN_MIX * weights.INIT_STD / h ** 0.5, seed,
                                    "head/" + name, dtype, device)
            tensor[:, :h] = torch.eye(h, dtype=dtype, device=device)
        else:
            tensor = weights._head_layer_tensor(name, meta.shape, shape, None, seed, dtype, device)
        state[name] = tensor
    head.load_state_dict(state, strict=False, assign=True)
    head.rotary_emb = LlamaRotaryEmbedding(config).to(device)
    return head.share(target.embed_tokens, target.lm_head).fuse_layers().requires_grad_(False)
