"""A word-level tokenizer for a synthetic target that covers every id of its vocabulary.

The first ids are the embedded tiny pair's words (so scenario prompts tokenize
to real ids, unknown words to <unk>), the rest placeholders `<t12345>`, so every
id a random target generates decodes to something readable.
"""

from __future__ import annotations

import json
from pathlib import Path

from parity.models.zoo import ASSETS

SOURCE = ASSETS / "tiny-llama3-eagle" / "target"


def word_vocabulary(vocab_size: int) -> dict[str, int]:
    """token -> id for ids 0..vocab_size-1: the tiny pair's words first, then `<tID>` placeholders."""
    words = json.loads((SOURCE / "tokenizer.json").read_text())["model"]["vocab"]
    vocab = {token: i for token, i in words.items() if i < vocab_size}
    taken = set(vocab.values())
    vocab.update({f"<t{i}>": i for i in range(vocab_size) if i not in taken})
    return vocab


def write_tokenizer(out_dir, vocab_size: int, max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json and generation_config.json for a target of `vocab_size` ids."""
    out_dir = Path(out_dir)
    tokenizer = json.loads((SOURCE / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"] = word_vocabulary(vocab_size)
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False) + "\n")
    config = json.loads((SOURCE / "tokenizer_config.json").read_text())
    config["model_max_length"] = max_length
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "generation_config.json").write_bytes((SOURCE / "generation_config.json").read_bytes())
