"""The embedded tiny pair from its safetensors and config.json, read without transformers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

ASSET = Path(__file__).resolve().parents[2] / "parity" / "assets" / "tiny-llama3-eagle"


@dataclass(frozen=True)
class Config:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    eps: float
    rope_theta: float


@dataclass
class Layer:
    wq: torch.Tensor          # [heads * head_dim, hidden]
    wk: torch.Tensor          # [kv_heads * head_dim, hidden]
    wv: torch.Tensor          # [kv_heads * head_dim, hidden]
    wo: torch.Tensor          # [hidden, heads * head_dim]
    w_gate: torch.Tensor      # [intermediate, hidden]
    w_up: torch.Tensor        # [intermediate, hidden]
    w_down: torch.Tensor      # [hidden, intermediate]
    attn_norm: torch.Tensor | None   # [hidden]; None in the EAGLE-1 layer (its input layernorm is dropped)
    mlp_norm: torch.Tensor    # [hidden]


@dataclass
class Target:
    config: Config
    embed: torch.Tensor       # [vocab, hidden]
    layers: list[Layer]
    norm: torch.Tensor        # [hidden]
    lm_head: torch.Tensor     # [vocab, hidden]


@dataclass
class Eagle:
    fc: torch.Tensor          # [hidden, 2 * hidden] over concat(embed(token), target hidden)
    layer: Layer


def _config(path: Path) -> Config:
    c = json.loads((path / "config.json").read_text())
    return Config(c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                  c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], c["intermediate_size"],
                  c["num_hidden_layers"], c["vocab_size"], c["rms_norm_eps"], c["rope_theta"])


def _layer(w: dict, prefix: str) -> Layer:
    norm = w.get(f"{prefix}input_layernorm.weight")
    return Layer(w[f"{prefix}self_attn.q_proj.weight"], w[f"{prefix}self_attn.k_proj.weight"],
                 w[f"{prefix}self_attn.v_proj.weight"], w[f"{prefix}self_attn.o_proj.weight"],
                 w[f"{prefix}mlp.gate_proj.weight"], w[f"{prefix}mlp.up_proj.weight"],
                 w[f"{prefix}mlp.down_proj.weight"], norm, w[f"{prefix}post_attention_layernorm.weight"])


def load_pair(device: str | torch.device = "cpu", root: Path = ASSET) -> tuple[Target, Eagle]:
    """(target, EAGLE-1 head) of the embedded pair, fp32 on `device`."""
    t = load_file(str(root / "target" / "model.safetensors"), device=str(device))
    e = load_file(str(root / "eagle" / "model.safetensors"), device=str(device))
    config = _config(root / "target")
    target = Target(config, t["model.embed_tokens.weight"],
                    [_layer(t, f"model.layers.{i}.") for i in range(config.layers)], t["model.norm.weight"],
                    t["lm_head.weight"])
    return target, Eagle(e["fc.weight"], _layer(e, "layers.0."))
