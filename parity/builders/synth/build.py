"""`parity models synth`: write a calibrated random-weights target + EAGLE head, no download.

The pair is generated on the target device (weights.py), the target's branch
scale calibrated for the requested acceptance (calibrate.py), and both are
written in the published layouts (spec.py) into a staging folder beside
OUT that is renamed to OUT only when complete, so a failed build leaves nothing
behind that looks like a pair.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import torch
from transformers import LlamaConfig

from parity.errors import ParityInputError
from parity.builders import saver
from parity.builders.shards import SHARD_BYTES, write_safetensors
from parity.builders.synth import weights as synth_weights
from parity.builders.synth.mtp_weights import mtp_state
from parity.builders.synth.calibrate import START, TOLERANCE, Calibration, calibrate, calibration_tokens
from parity.builders.synth.peak import Peak, calibrate_peak
from parity.builders.synth.spec import (INFO_FILE, TARGET_FOLDER, SynthRequest, SynthShape, head_config,
                                        target_config)
from parity.builders.synth.tokenizer import write_tokenizer
from parity.models import memory

GIB = 1 << 30


def build_bytes(shape: SynthShape, head: str, dtype: torch.dtype, mtp_layers: int = 1) -> int:
    """Bytes of the pair's weights in `dtype` (also what lands on disk)."""
    head_params = memory.head_params(head_config(shape, head, mtp_layers))
    return (memory.target_params(target_config(shape)) + head_params) * dtype.itemsize


def check_build_memory(shape: SynthShape, head: str, dtype: torch.dtype, device: torch.device,
                       mtp_layers: int = 1) -> None:
    """One-line ParityInputError when the build will not fit in GPU memory or RAM."""
    weights = build_bytes(shape, head, dtype, mtp_layers)
    margin = max(GIB // 2, weights // 10)       # calibration activations and logits, allocator slack
    staging = 2 * min(weights, SHARD_BYTES)     # one shard copied to the CPU, and its serialisation
    name = str(dtype).removeprefix("torch.")
    hint = "--dtype bfloat16" if dtype == torch.float32 else "a machine with more memory"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if weights + margin > free:
            raise ParityInputError(
                f"synth {shape.name}: needs about {(weights + margin) / GIB:.1f} GiB of GPU memory "
                f"({weights / GIB:.1f} GiB of weights in {name}) but {device} has {free / GIB:.1f} GiB free; "
                f"use {hint} or free GPU memory")
        ram_needed = staging
    else:
        ram_needed = weights + staging + margin
    ram = memory._available_ram()
    if ram is not None and ram_needed > ram:
        where = "" if device.type == "cuda" else f" ({weights / GIB:.1f} GiB of weights in {name} + shard staging)"
        raise ParityInputError(
            f"synth {shape.name}: needs about {ram_needed / GIB:.1f} GiB of CPU memory{where} but {ram / GIB:.1f} GiB "
            f"is available; use {hint}{', or --device cuda on a GPU machine' if device.type == 'cpu' else ''}")


def check_out(out: Path) -> None:
    """OUT must be new, or an empty folder: a pair is never written over other files."""
    if out.exists() and not out.is_dir():
        raise ParityInputError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise ParityInputError(f"--out {out}: exists and is not empty (give a new folder)")


def check_disk(out: Path, needed_bytes: int) -> None:
    """The file system OUT lands on must have room for the pair."""
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if needed_bytes > free:
        raise ParityInputError(f"--out {out}: needs about {needed_bytes / GIB:.1f} GiB of disk, "
                               f"{free / GIB:.1f} GiB free there")


def _staging(out: Path) -> Path:
    staging = out.parent / f".{out.name}.synth-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as exc:
        raise ParityInputError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    return staging


def _publish(staging: Path, out: Path) -> None:
    if out.is_dir():
        out.rmdir()      # checked empty before the build
    staging.rename(out)


def synthesize(request: SynthRequest, progress: Callable[[str], None] = print) -> dict:
    """Build, calibrate and write the pair `request` names; return what synth_info.json records."""
    shape, dtype = request.spec, request.torch_dtype
    device = request.torch_device()
    out = Path(request.out)
    check_out(out)
    check_build_memory(shape, request.head, dtype, device, request.mtp_layers)
    check_disk(out, build_bytes(shape, request.head, dtype, request.mtp_layers) + (64 << 20))   # + tokenizer and configs
    staging = _staging(out)
    try:
        with torch.no_grad():
            info = _build(request, device, staging, progress)
        _publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return info


def _build(request: SynthRequest, device: torch.device, staging: Path, progress) -> dict:
    shape, dtype, seed = request.spec, request.torch_dtype, request.seed
    config = LlamaConfig.from_dict(target_config(shape, request.recurrent_layers))
    # NOTE: calibration runs transformers' stock attention; the harness later loads the
    # same files with its paged attention.
    config._attn_implementation = "sdpa"
    frequent = synth_weights.frequent_ids(shape, seed)
    params = memory.target_params(target_config(shape))
    count = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"
    progress(f"synth {shape.name} + {request.head}: {count} target parameters in {request.dtype} on {device}, "
             f"seed {seed}")
    target = synth_weights.build_target(shape, config, seed, START, frequent, dtype, device)
    peak = _calibrate_peak(request, target, frequent, device, progress)
    progress(f"calibrating the target's o_proj/down_proj scale for agreement {request.acceptance} with the "
             f"draft's bigram:")
    calibration = calibrate(target, shape, frequent, seed, request.acceptance, request.head == "eagle3", progress)
    progress(f"chose scale {calibration.scale:.3g}: measured agreement {calibration.agreement:.3f} "
             f"(requested {request.acceptance}, {calibration.positions} positions)")
    if abs(calibration.agreement - request.acceptance) > 5 * TOLERANCE:
        progress(f"note: the closest agreement reached is {calibration.agreement:.3f}")
    raw_head_config = head_config(shape, request.head, request.mtp_layers)
    head_state = _head_state(request, LlamaConfig.from_dict(raw_head_config), target, frequent, peak, device)
    _write_target(target, shape, dtype, staging / TARGET_FOLDER, progress, request.recurrent_layers)
    del target
    _write_folder(head_state, raw_head_config, dtype, staging / request.head, progress)
    info = synth_info(request, device, calibration, peak)
    (staging / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return info


def _calibrate_peak(request: SynthRequest, target, frequent, device, progress) -> Peak | None:
    """The logit scale for the request's peak, set on the target (None: no peak requested)."""
    if request.draft_peak is None:
        return None
    tokens = calibration_tokens(frequent, request.seed).to(device)
    peak = calibrate_peak(target, request.spec, tokens, request.draft_peak,
                          frequent if request.head == "eagle3" else None)
    progress(f"chose logit scale {peak.scale:.4g}: the draft's top token holds {peak.peak:.3f} of its probability "
             f"on average (requested {peak.requested}, {peak.positions} positions, {len(peak.trials)} scales tried)")
    return peak


def _head_state(request: SynthRequest, head_cfg: LlamaConfig, target, frequent, peak: Peak | None, device) -> dict:
    shape, dtype, seed = request.spec, request.torch_dtype, request.seed
    scale, gain = (peak.scale, peak.head_gain) if peak is not None else (1.0, 1.0)
    tokens = calibration_tokens(frequent, seed).to(device)
    if request.head.startswith("mtp-"):
        return mtp_state(head_cfg, request.head, shape, target, seed, tokens, dtype, device, scale)
    if request.head == "eagle3":
        return synth_weights.eagle3_state(head_cfg, shape, target, frequent, seed, dtype, device, scale)
    return synth_weights.eagle1_state(head_cfg, shape, target, seed, tokens, dtype, device, scale, gain)


def _config_json(raw: dict, dtype: torch.dtype) -> dict:
    config = saver.config_dict(LlamaConfig.from_dict(raw), dtype)
    config["architectures"] = raw["architectures"]
    rope = raw["rope_parameters"]
    if rope["rope_type"] != "default":
        # NOTE: transformers 4 and engines read the legacy key.
        config.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    return config


def _write_folder(state: dict, raw_config: dict, dtype: torch.dtype, folder: Path, progress) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_config_json(raw_config, dtype), indent=2, sort_keys=True) + "\n")
    files = write_safetensors(state, folder)
    progress(f"wrote {folder.name}/: {', '.join(f.name for f in files)}")


def _write_target(target, shape: SynthShape, dtype: torch.dtype, folder: Path, progress, recurrent=()) -> None:
    state = {k: v for k, v in target.state_dict().items() if "rotary_emb" not in k}
    if shape.tie_word_embeddings:
        state.pop("lm_head.weight")   # tied: transformers re-ties it on load, as for Llama-3.2-1B
    _write_folder(state, target_config(shape, recurrent), dtype, folder, progress)
    write_tokenizer(folder, shape.vocab_size, shape.max_position_embeddings)


def synth_info(request: SynthRequest, device: torch.device, calibration: Calibration, peak: Peak | None = None) -> dict:
    """synth_info.json: what was asked, what calibration measured, and how the weights were made."""
    import safetensors
    import transformers

    shape = request.spec
    return {
        "shape": shape.name, "head": request.head, "recurrent_layers": list(request.recurrent_layers), "mtp_layers": request.mtp_layers, "seed": request.seed, "dtype": request.dtype,
        "device": device.type, "acceptance_requested": request.acceptance,
        "scale": calibration.scale, "agreement": round(calibration.agreement, 6),
        "calibration": {"positions": calibration.positions, "start_scale": START, "tolerance": TOLERANCE,
                        "trials": [{"scale": t.scale, "agreement": round(t.agreement, 6)} for t in calibration.trials]},
        "draft_vocab_size": shape.draft_vocab_size if request.head == "eagle3" else shape.vocab_size,
        "peak": None if peak is None else {
            "requested": peak.requested, "logit_scale": peak.scale, "measured": round(peak.peak, 6),
            "head_gain": peak.head_gain, "positions": peak.positions,
            "trials": [{"scale": s, "peak": round(p, 6)} for s, p in peak.trials]},
        "recipe": {"init_std": synth_weights.INIT_STD, "head_branch_scale": synth_weights.HEAD_BRANCH_SCALE,
                   "head_attention_mix": synth_weights.HEAD_ATTN_MIX,
                   "hidden_mix": synth_weights.HIDDEN_MIX, "rare_token_gain": synth_weights.RARE_TOKEN_GAIN,
                   "frequent_tokens": shape.draft_vocab_size, "eagle3_attention_gain": synth_weights.ATTN_GAIN},
        "target": TARGET_FOLDER, "draft": request.head,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "safetensors": safetensors.__version__},
    }
