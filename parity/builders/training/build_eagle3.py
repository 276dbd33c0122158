"""Build the embedded pair `tiny-llama3-eagle3`: the tiny target plus an EAGLE-3 head.

    python -m parity.builders.training.build_eagle3      # or: parity models build --pair tiny-llama3-eagle3

The target is `tiny-llama3-eagle`'s, copied byte for byte into
`tiny-llama3-eagle3/target` (so the pair loads like any other; `build_info.json`
records the sha256 of the source weights). The head reads the hidden states
entering target layers (0, 1, 2): for a 2-layer target, vLLM's default
(2, N//2, N-3) is meaningless, so the ids are written into the head's config
(`eagle_aux_hidden_state_layer_ids`): the embeddings, the residual stream
between the two layers, and the last layer's output before the final norm:
low, middle and high features, as (2, 16, 29) are for a 32-layer Llama. The
draft vocabulary is the 256 most frequent tokens of the training stream.

The acceptance estimate runs the real engine (eager, greedy, K=3) on the pair
as written, reloaded through the loader.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import tokenizers

from parity.engine.config import EngineConfig
from parity.engine.spec_decode import RequestSpec, SpecDecodeEngine
from parity.builders import saver
from parity.models import loader
from parity.models.assets import ASSETS_ROOT, TINY_PAIR, write_manifest
from parity.builders.training import corpus
from parity.builders.training.build import (ACCEPTANCE_K, ACCEPTANCE_MAX_NEW_TOKENS, NUM_ESTIMATE_PROMPTS,
                                         NUM_TRAIN_STORIES, SEED, _mean_tail, _rounded, deterministic_torch,
                                         estimate_prompts, library_versions, token_stream)
from parity.builders.training.eagle3_train import draft_vocabulary, train_eagle3_head
from parity.builders.training.train import TrainSettings, attention_implementation, distinct_ngram_fraction

PAIR = "tiny-llama3-eagle3"
AUX_LAYER_IDS = (0, 1, 2)
DRAFT_VOCAB_SIZE = 256
TTT_STEPS = 3
STEP_DECAY = 0.8
HEAD_SETTINGS = TrainSettings(steps=300, batch_size=16, seq_len=256, lr=3e-3, seed=SEED + 2)
TARGET_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json")


def engine_acceptance(target, head, prompts: list[list[int]], k: int = ACCEPTANCE_K,
                      max_new_tokens: int = ACCEPTANCE_MAX_NEW_TOKENS) -> dict:
    """Greedy per-position acceptance (vLLM's definition) of the eager engine on `prompts`.

    NOTE: one sequence at a time: a request's acceptance must not depend on what it is
    batched with, and a batch-free estimate is what the unpaged EAGLE-1 replay measures.
    """

    longest = max(len(p) for p in prompts)
    config = EngineConfig(num_speculative_tokens=k, max_num_seqs=1, block_size=16,
                          max_model_len=min(target.config.max_position_embeddings,
                                            longest + max_new_tokens + 4 * k + 8),
                          max_num_batched_tokens=max(64, longest + k + 1))
    specs = [RequestSpec(i, tuple(p), max_new_tokens) for i, p in enumerate(prompts)]
    result = SpecDecodeEngine(target, head, config).run(specs)
    drafts = result.drafts
    num_drafts = max(1, drafts.groupby(["step", "req_id"]).ngroups)
    rates = [float(drafts[drafts.draft_index == i].accepted.sum()) / num_drafts for i in range(k)]
    diversity = [distinct_ngram_fraction(result.outputs[s.req_id]) for s in specs]
    return {"num_drafts": num_drafts, "acceptance_per_position": rates,
            "mean_acceptance_length": 1 + sum(rates),
            "distinct_4gram_fraction": sum(diversity) / len(diversity)}


def _sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def build_tiny_eagle3_pair(out_dir: Path, source_dir: Path | None = None,
                           progress: Callable[[str], None] | None = None) -> dict:
    """Train and write the pair into `out_dir/target`, `out_dir/eagle3`, `out_dir/build_info.json`."""
    say = progress or (lambda _line: None)
    out_dir = Path(out_dir)
    source_dir = Path(source_dir) if source_dir else ASSETS_ROOT / TINY_PAIR / "target"
    started = time.perf_counter()
    with deterministic_torch(threads=1):
        say(f"reading the target in {source_dir} and re-generating its training stream")
        target = loader.load_target(source_dir)
        model = target.hf
        tok = tokenizers.Tokenizer.from_file(str(source_dir / "tokenizer.json"))
        stream = token_stream(tok, corpus.generate_corpus(SEED, NUM_TRAIN_STORIES))
        _, _, coverage = draft_vocabulary(stream, model.config.vocab_size, DRAFT_VOCAB_SIZE)

        say(f"training EAGLE-3 head ({HEAD_SETTINGS.steps} steps, {TTT_STEPS} unrolled steps each)")
        with attention_implementation("sdpa", model.config):
            head, rows = train_eagle3_head(model, stream, HEAD_SETTINGS, DRAFT_VOCAB_SIZE, AUX_LAYER_IDS,
                                           TTT_STEPS, STEP_DECAY, say)

        target_dir, head_dir = out_dir / "target", out_dir / "eagle3"
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in TARGET_FILES:
            shutil.copyfile(source_dir / name, target_dir / name)
        saver.save_eagle3(head, head_dir)

        say("estimating greedy acceptance with the eager engine on held-out prompts")
        shipped_target = loader.load_target(target_dir)
        shipped_head = loader.load_head(head_dir, shipped_target)
        acceptance = engine_acceptance(shipped_target, shipped_head, estimate_prompts(tok))
        say("acceptance per position " + " / ".join(f"{r:.3f}" for r in acceptance["acceptance_per_position"])
            + f", mean acceptance length {acceptance['mean_acceptance_length']:.3f}")

    tail = lambda i: _mean_tail([r[i] for r in rows])  # noqa: E731
    info = _rounded({
        "name": PAIR,
        "seed": SEED,
        "target": {"copied_from": f"{TINY_PAIR}/target",
                   "model_safetensors_sha256": _sha256(source_dir / "model.safetensors")},
        "head": {
            "parameters": sum(v.numel() for k, v in head.head_state_dict().items() if k not in ("d2t", "t2d")),
            "aux_layer_ids": list(AUX_LAYER_IDS),
            "draft_vocab_size": DRAFT_VOCAB_SIZE,
            "draft_vocab_token_coverage": coverage,
            "settings": asdict(HEAD_SETTINGS),
            "ttt_steps": TTT_STEPS,
            "step_decay": STEP_DECAY,
            "final_loss_per_step": [tail(i) for i in range(TTT_STEPS)],
            "final_top1_per_step": [tail(TTT_STEPS + i) for i in range(TTT_STEPS)],
            "threads": 1,
        },
        "acceptance": {"k": ACCEPTANCE_K, "max_new_tokens": ACCEPTANCE_MAX_NEW_TOKENS,
                       "num_prompts": NUM_ESTIMATE_PROMPTS, "engine": "eager", **acceptance},
        "versions": library_versions(),
    })
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    info["build_seconds"] = round(time.perf_counter() - started, 1)
    say(f"built {PAIR} in {info['build_seconds']} s")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", type=Path, default=ASSETS_ROOT, help="assets root (gets the manifest)")
    args = parser.parse_args(argv)
    build_tiny_eagle3_pair(args.assets / PAIR, args.assets / TINY_PAIR / "target",
                           progress=lambda line: print(line, flush=True))
    write_manifest(args.assets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
