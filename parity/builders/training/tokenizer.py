"""A word-level tokenizer for the synthetic corpus, saved in Hugging Face layout.

`tokenizer.json` holds a `tokenizers` WordLevel model (whitespace split, each
punctuation mark its own word) that adds `<bos>` in front of every encoding, as
Llama-3's tokenizer adds `<|begin_of_text|>`; `tokenizer_config.json` names the
special tokens and turns on the clean-up that glues punctuation back on decode.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors

from parity.builders.training.corpus import vocabulary

UNK, BOS, EOS = "<unk>", "<bos>", "<eos>"
SPECIAL_TOKENS = [UNK, BOS, EOS]
MAX_VOCAB = 512


def build_tokenizer(words: list[str] | None = None) -> Tokenizer:
    """The tokenizer over `words` (default: the corpus grammar's vocabulary)."""
    words = vocabulary() if words is None else words
    vocab = {tok: idx for idx, tok in enumerate(SPECIAL_TOKENS + [w for w in words if w not in SPECIAL_TOKENS])}
    if len(vocab) > MAX_VOCAB:
        raise ValueError(f"vocabulary has {len(vocab)} entries, more than {MAX_VOCAB}")
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("isolated")])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])])
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "clean_up_tokenization_spaces": True,
        "model_max_length": 512,
    }


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
