"""Long prompts for scenarios/long-context-8k.yaml, cut from the corpus's stories (deterministic).

    python -m parity.builders.training.long_prompts          # rewrites scenarios/prompts/long.jsonl

Each prompt is held-out stories of the training corpus, one after another,
cut at the first word that brings it to its target length in word-level
tokens (`corpus.words`: a word or a punctuation mark each, which is what the
embedded tokenizer and the synthetic pairs' tokenizers encode one token at a
time). The stories are the embedded pair's own kind of text, so its drafts
stay meaningful thousands of tokens in; every id is a real word.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from parity.builders.training.corpus import generate_corpus, words

# prompt id -> length in tokens: spread over 4000-7000 so chunked prefill (2048 tokens a
# step) cuts each one differently, and the longest still leaves room in 8192 for its output.
TARGETS = {"long-4k": 4000, "long-5k": 5000, "long-6k": 6000, "long-7k": 7000}
SEED = 8192
OUT = Path(__file__).resolve().parent.parent.parent / "scenarios" / "prompts" / "long.jsonl"


def long_prompt(index: int, target: int) -> str:
    """Held-out stories of stream `index`, joined and cut to `target` word-level tokens."""
    pieces: list[str] = []
    count, batch = 0, 0
    while True:
        for story in generate_corpus(SEED + 1000 * index + batch, 16, split="heldout"):
            for piece in story.split(" "):
                count += len(words(piece))
                pieces.append(piece)
                if count >= target:
                    return " ".join(pieces)
        batch += 1


def prompts() -> list[dict]:
    return [{"id": name, "text": long_prompt(i, target)} for i, (name, target) in enumerate(TARGETS.items())]


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0]) if argv else OUT
    out.write_text("".join(json.dumps(p) + "\n" for p in prompts()))
    for p in prompts():
        print(f"{p['id']}: {len(words(p['text']))} tokens")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
