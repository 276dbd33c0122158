"""Build the embedded pair `tiny-llama3-eagle`: corpus, tokenizer, target, EAGLE-1 head, files.

    python -m parity.builders.training.build            # rebuild parity/assets/ + default prompts

Everything is seeded and step-counted, so a rebuild on the same machine and
library versions reproduces the same bytes; other machines may differ in the
last bits, which is why the weights are committed with a checksum manifest.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import safetensors
import tokenizers
import torch
import transformers

from parity.builders import saver
from parity.models import loader
from parity.models.assets import ASSETS_ROOT, TINY_PAIR, write_manifest
from parity.builders.training import corpus
from parity.builders.training.tokenizer import BOS, EOS, build_tokenizer, save_tokenizer
from parity.builders.training.train import (TrainSettings, acceptance_report, perplexity, target_config,
                                         train_head, train_target)
from parity.models.llama import TargetModel

SEED = 0
NUM_TRAIN_STORIES = 4000
NUM_HELDOUT_STORIES = 60
NUM_ESTIMATE_PROMPTS = 32
NUM_DEFAULT_PROMPTS = 16
TARGET_SETTINGS = TrainSettings(steps=300, batch_size=16, seq_len=256, lr=3e-3, seed=SEED)
HEAD_SETTINGS = TrainSettings(steps=300, batch_size=16, seq_len=256, lr=3e-3, seed=SEED + 1)
HEAD_TOKEN_WEIGHT = 0.1
HEAD_FEATURE_NOISE = 0.0
ACCEPTANCE_K = 3
ACCEPTANCE_MAX_NEW_TOKENS = 48
DEFAULT_PROMPTS_PATH = Path(__file__).resolve().parents[3] / "scenarios" / "prompts" / "default.jsonl"


def token_stream(tok: tokenizers.Tokenizer, stories: list[str]) -> torch.Tensor:
    """Stories packed as `<bos> story <eos>` one after another."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for encoding in tok.encode_batch(stories):
        ids += encoding.ids + [eos]
    return torch.tensor(ids, dtype=torch.long)


def estimate_prompts(tok: tokenizers.Tokenizer, seed: int = SEED) -> list[list[int]]:
    """Token ids of the held-out prompts the acceptance estimate runs on (defaults first)."""
    return [tok.encode(p["text"]).ids for p in corpus.heldout_prompts(seed, NUM_ESTIMATE_PROMPTS)]


def write_default_prompts(path: Path = DEFAULT_PROMPTS_PATH, seed: int = SEED) -> list[dict]:
    """Write the held-out default prompt set as JSON lines ({"id", "text"})."""
    prompts = corpus.heldout_prompts(seed, NUM_DEFAULT_PROMPTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return prompts


@contextmanager
def deterministic_torch(threads: int):
    """Deterministic kernels on a fixed thread count for a build; the caller's settings come back after."""
    saved = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1])


def _mean_tail(values: list[float], n: int = 20) -> float:
    tail = values[-n:]
    return round(sum(tail) / len(tail), 6)


def _rounded(obj):
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def build_tiny_pair(out_dir: Path, progress: Callable[[str], None] | None = None) -> dict:
    """Train and write the tiny pair into `out_dir/target`, `out_dir/eagle`, `out_dir/build_info.json`.

    Returns the build info (plus `build_seconds`, which is not written: the file stays reproducible).
    """
    say = progress or (lambda _line: None)
    out_dir = Path(out_dir)
    started = time.perf_counter()
    with deterministic_torch(threads=2):
        say("generating corpus and tokenizer")
        tok = build_tokenizer()
        train_stories = corpus.generate_corpus(SEED, NUM_TRAIN_STORIES)
        heldout_stories = corpus.generate_corpus(SEED, NUM_HELDOUT_STORIES, split="heldout")
        train_stream = token_stream(tok, train_stories)
        heldout_stream = token_stream(tok, heldout_stories)
        config = target_config(tok.get_vocab_size(), tok.token_to_id(BOS), tok.token_to_id(EOS))

        say(f"training target ({TARGET_SETTINGS.steps} steps)")
        model, target_losses = train_target(config, train_stream, TARGET_SETTINGS, say)
        ppl = perplexity(model, heldout_stream)
        say(f"target held-out perplexity {ppl:.3f}")

        say(f"training EAGLE-1 head ({HEAD_SETTINGS.steps} steps)")
        head, head_losses = train_head(model, train_stream, HEAD_SETTINGS, HEAD_TOKEN_WEIGHT,
                                       HEAD_FEATURE_NOISE, say)

        target_dir, eagle_dir = out_dir / "target", out_dir / "eagle"
        _save_pair(model, head, tok, config, target_dir, eagle_dir)

        # The estimate runs on the pair as written, reloaded through the loader.
        say("estimating greedy acceptance on held-out prompts")
        target = loader.load_target(target_dir)
        shipped_head = loader.load_eagle1(eagle_dir, target)
        acceptance = acceptance_report(target, shipped_head, estimate_prompts(tok), ACCEPTANCE_K,
                                       ACCEPTANCE_MAX_NEW_TOKENS)
        say("acceptance per position " + " / ".join(f"{r:.3f}" for r in acceptance["acceptance_per_position"])
            + f", distinct 4-grams {acceptance['distinct_4gram_fraction']:.3f}")

    info = _build_info(tok, train_stream, heldout_stream, model, target_losses, ppl, head, head_losses, acceptance)
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    info["build_seconds"] = round(time.perf_counter() - started, 1)
    say(f"built {TINY_PAIR} in {info['build_seconds']} s")
    return info


def _save_pair(model, head, tok, config, target_dir: Path, eagle_dir: Path) -> None:
    saver.save_target(TargetModel(model), None, target_dir)
    save_tokenizer(tok, target_dir)
    (target_dir / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id, "do_sample": False},
        indent=2, sort_keys=True) + "\n")
    saver.save_eagle1(head, eagle_dir)


def _build_info(tok, train_stream, heldout_stream, model, target_losses, ppl, head, head_losses,
                acceptance) -> dict:
    """What build_info.json records: corpus, both models' training, acceptance, library versions."""
    return _rounded({
        "name": TINY_PAIR,
        "seed": SEED,
        "corpus": {
            "train_stories": NUM_TRAIN_STORIES, "train_tokens": train_stream.numel(),
            "heldout_stories": NUM_HELDOUT_STORIES, "heldout_tokens": heldout_stream.numel(),
            "vocab_size": tok.get_vocab_size(),
        },
        "target": {
            "parameters": sum(p.numel() for p in model.parameters()),
            "settings": asdict(TARGET_SETTINGS),
            "final_loss": _mean_tail(target_losses),
            "heldout_perplexity": ppl,
        },
        "head": {
            "parameters": sum(v.numel() for v in head.head_state_dict().values()),
            "settings": asdict(HEAD_SETTINGS),
            "token_weight": HEAD_TOKEN_WEIGHT,
            "feature_noise": HEAD_FEATURE_NOISE,
            "final_feature_loss": _mean_tail([f for f, _ in head_losses]),
            "final_token_loss": _mean_tail([t for _, t in head_losses]),
        },
        "acceptance": {"k": ACCEPTANCE_K, "max_new_tokens": ACCEPTANCE_MAX_NEW_TOKENS,
                       "num_prompts": NUM_ESTIMATE_PROMPTS, **acceptance},
        "versions": library_versions(),
    })


def library_versions() -> dict[str, str]:
    """The versions a build depends on, recorded in build_info.json."""
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", type=Path, default=ASSETS_ROOT, help="assets root (gets the manifest)")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS_PATH, help="default prompts file")
    args = parser.parse_args(argv)
    build_tiny_pair(args.assets / TINY_PAIR, progress=lambda line: print(line, flush=True))
    write_default_prompts(args.prompts)
    write_manifest(args.assets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
