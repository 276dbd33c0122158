"""Synthetic pairs: the shapes `parity models synth` builds and the layouts it writes.

One place for both, so the builder, its tests and docs/models.md agree:
- shapes: published Llama-3 configurations (`llama3-8b` = Meta-Llama-3-8B,
  `llama3-1b` = Llama-3.2-1B) and a `tiny` one that builds in seconds on a CPU;
- layouts: a pair folder `OUT/` holding `target/` (a Hugging Face
  LlamaForCausalLM folder: config.json, safetensors shards + index when large,
  tokenizer files) and `eagle1/`, `eagle3/`, `mtp-deepseek/` or `mtp-qwen3next/` (the head in its published layout,
  see loader.py), plus `synth_info.json`; the config dicts of all three.
"""

from __future__ import annotations

from dataclasses import dataclass

from parity.errors import ParityInputError

HEADS = ("eagle1", "eagle3", "mtp-deepseek", "mtp-qwen3next")
MAX_MTP_LAYERS = 8
TARGET_FOLDER = "target"
INFO_FILE = "synth_info.json"
# The weights dtypes, by torch's names. No torch is imported at the top of this module: the command line's
# parser lists SHAPES (`parity bench --alarm-shape`), and its --help and bad flags answer before torch loads.
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
# The tokenizer's special tokens (parity/assets/tiny-llama3-eagle's word-level vocabulary).
BOS_ID, EOS_ID = 1, 2


@dataclass(frozen=True)
class SynthShape:
    """A Llama-3 architecture at one size, and the EAGLE-3 choices that go with it."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    draft_vocab_size: int                 # EAGLE-3 draft vocabulary = the shape's frequent tokens
    eagle3_aux_layers: tuple[int, ...]    # hidden states entering these target layers feed EAGLE-3's fc
    description: str
    rope_theta: float = 500000.0
    rope_scaling: tuple[tuple[str, float], ...] = ()   # Llama-3.1+ "llama3" frequency scaling, as pairs
    rms_norm_eps: float = 1e-5
    # The draft's mean top-1 probability a build calibrates to by default (peak.py); None: Llama's init as is
    # (at 128256 tokens a nearly flat draft, every log-probability about -11.7).
    peak: float | None = None

    def __post_init__(self) -> None:
        for field in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                      "intermediate_size", "vocab_size", "max_position_embeddings", "draft_vocab_size"):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < 1:
                raise ValueError(f"shape {self.name}: {field} must be a positive integer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"shape {self.name}: attention heads must be a multiple of KV heads")
        # NOTE: the synthetic EAGLE-3 head carries the token embedding through its
        # attention's value path (weights.eagle3_state), which needs all h dims.
        if self.num_attention_heads * self.head_dim != self.hidden_size:
            raise ValueError(f"shape {self.name}: heads x head_dim must equal hidden_size")
        if not self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"shape {self.name}: draft_vocab_size exceeds vocab_size")
        if len(self.eagle3_aux_layers) != 3 or not all(0 <= i <= self.num_hidden_layers
                                                       for i in self.eagle3_aux_layers):
            raise ValueError(f"shape {self.name}: eagle3_aux_layers must be 3 ids in 0..{self.num_hidden_layers}")


# Real EAGLE heads put 0.3-0.9 of their mass on their top token; the real shapes' pairs are built at this.
REAL_PEAK = 0.6
LLAMA3_SCALING = (("factor", 32.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0),
                  ("original_max_position_embeddings", 8192))

SHAPES: dict[str, SynthShape] = {s.name: s for s in [
    SynthShape("llama3-8b", num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
               head_dim=128, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
               max_position_embeddings=8192, draft_vocab_size=32000, eagle3_aux_layers=(2, 16, 29), peak=REAL_PEAK,
               description="Meta-Llama-3-8B (8.0B parameters, untied embeddings)"),
    SynthShape("llama3-70b", num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
               head_dim=128, intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False,
               max_position_embeddings=8192, draft_vocab_size=32000, eagle3_aux_layers=(2, 40, 77), peak=REAL_PEAK,
               description="Meta-Llama-3-70B (70.6B parameters, untied embeddings); tensor parallel, generated "
                           "on each rank's GPU at load (--at-load, docs/tp.md)"),
    SynthShape("llama3-1b", num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
               head_dim=64, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
               max_position_embeddings=131072, draft_vocab_size=32000, eagle3_aux_layers=(2, 8, 13), peak=REAL_PEAK,
               rope_scaling=LLAMA3_SCALING, description="Llama-3.2-1B (1.2B parameters, tied embeddings)"),
    SynthShape("tiny", num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
               head_dim=32, intermediate_size=384, vocab_size=512, tie_word_embeddings=False,
               max_position_embeddings=2048, draft_vocab_size=256, eagle3_aux_layers=(0, 1, 2),
               description="2 layers, hidden 128, vocab 512: builds and calibrates in seconds on a CPU"),
]}


@dataclass(frozen=True)
class SynthRequest:
    """What `parity models synth` was asked for, validated once."""

    shape: str
    head: str
    acceptance: float
    dtype: str
    out: str
    seed: int = 0
    device: str = "auto"
    mtp_layers: int = 1      # MTP heads: num_nextn_predict_layers
    hybrid_every: int = 0    # a hybrid target: every Nth layer (N-1, 2N-1, ...) a recurrent mixer; 0: attention only
    peak: float | None = None   # the draft's mean top-1 probability (peak.py); None: the shape's; 0: none

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ParityInputError(f"unknown shape {self.shape!r}; known shapes: {', '.join(SHAPES)}")
        if self.head not in HEADS:
            raise ParityInputError(f"unknown head {self.head!r}; known heads: {', '.join(HEADS)}")
        if not isinstance(self.acceptance, (int, float)) or not 0.0 < self.acceptance < 1.0:
            raise ParityInputError(f"--acceptance must be strictly between 0 and 1, got {self.acceptance!r}")
        if self.dtype not in DTYPES:
            raise ParityInputError(f"unknown dtype {self.dtype!r}; known dtypes: {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise ParityInputError(f"unknown device {self.device!r}; use one of {', '.join(DEVICES)}")
        if not isinstance(self.mtp_layers, int) or not 1 <= self.mtp_layers <= MAX_MTP_LAYERS:
            raise ParityInputError(f"--mtp-layers must be an integer in 1..{MAX_MTP_LAYERS}, got {self.mtp_layers!r}")
        if self.mtp_layers != 1 and not self.head.startswith("mtp-"):
            raise ParityInputError(f"--mtp-layers is for the MTP heads (mtp-deepseek, mtp-qwen3next), not {self.head}")
        if not isinstance(self.hybrid_every, int) or not 0 <= self.hybrid_every <= self.spec.num_hidden_layers:
            raise ParityInputError(f"--hybrid-every must be an integer in 1..{self.spec.num_hidden_layers} for shape "
                                   f"{self.shape}, got {self.hybrid_every!r}")
        if self.hybrid_every and self.head != "eagle1":
            raise ParityInputError(f"--hybrid targets are built with the eagle1 head (the drafter stays attention-only), "
                                   f"not {self.head}")
        if self.peak is not None and (not isinstance(self.peak, (int, float)) or not 0.0 <= self.peak < 1.0):
            raise ParityInputError(f"--peak must be in [0, 1) (0: no calibrated peak), got {self.peak!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ParityInputError(f"--seed must be a non-negative integer, got {self.seed!r}")

    @property
    def spec(self) -> SynthShape:
        return SHAPES[self.shape]

    @property
    def draft_peak(self) -> float | None:
        """The mean top-1 probability to calibrate the pair to, or None for Llama's init as is."""
        peak = self.spec.peak if self.peak is None else self.peak
        return peak or None

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """The target layers that are recurrent mixers (`parity/models/recurrent.py`)."""
        every = self.hybrid_every
        return tuple(range(every - 1, self.spec.num_hidden_layers, every)) if every else ()

    @property
    def torch_dtype(self):
        """torch's dtype of `dtype` (torch.float32, ...)."""
        import torch

        return getattr(torch, self.dtype)

    def torch_device(self):
        """The device weights are generated and calibrated on (auto: CUDA when present)."""
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise ParityInputError("--device cuda: CUDA is not available on this machine (use cpu or auto)")
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


def _rope(shape: SynthShape) -> dict:
    rope = {"rope_type": "llama3" if shape.rope_scaling else "default", "rope_theta": shape.rope_theta}
    rope.update(dict(shape.rope_scaling))
    return rope


def target_config(shape: SynthShape, recurrent_layers: tuple[int, ...] = ()) -> dict:
    """config.json of the target: a LlamaForCausalLM of `shape` (dtype is added when written); a hybrid one
    names its `recurrent_layers`, each a mixer of `num_key_value_heads` heads of min(64, head_dim) dims."""
    hybrid = {"recurrent_layers": list(recurrent_layers), "recurrent_heads": shape.num_key_value_heads,
              "recurrent_head_dim": min(64, shape.head_dim)} if recurrent_layers else {}
    return {**hybrid,
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "num_hidden_layers": shape.num_hidden_layers, "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_attention_heads, "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim, "intermediate_size": shape.intermediate_size, "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings, "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps, "rope_parameters": _rope(shape), "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
    }


def head_config(shape: SynthShape, head: str, mtp_layers: int = 1) -> dict:
    """config.json of the draft head in the published layout of `head`.

    EAGLE-1 (yuhuili/EAGLE-LLaMA3-Instruct-8B): the target's config with one layer.
    MTP (DeepSeek-V3, Qwen3-Next): the target's config with `num_nextn_predict_layers`.
    EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): one layer, `draft_vocab_size`,
    the aux layer ids, and two synthetic choices (see weights.eagle3_state):
    no GQA in the head's layer (its values carry the whole token embedding) and
    `norm_before_residual` (the residual is the normed hidden input, as in
    speculators' checkpoints), so the draft of each step follows its own token.
    """
    if head.startswith("mtp-"):
        # The published MTP configs are the target's, plus the number of MTP layers after its own.
        return {**target_config(shape), "num_nextn_predict_layers": mtp_layers}
    config = {**target_config(shape), "num_hidden_layers": 1, "tie_word_embeddings": False}
    if head == "eagle1":
        return config
    return {**config, "architectures": ["LlamaForCausalLMEagle3"],
            "num_key_value_heads": shape.num_attention_heads, "draft_vocab_size": shape.draft_vocab_size,
            "target_hidden_size": shape.hidden_size, "norm_before_residual": True,
            "eagle_aux_hidden_state_layer_ids": list(shape.eagle3_aux_layers)}
