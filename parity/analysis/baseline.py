"""Committed acceptance baselines: counts per mode and position, tied to one model and one scenario.

A baseline is JSON (schema below), written atomically by `parity gate
--update-baseline` and read by `parity gate --baseline FILE`. It is refused,
with one line, when it was made for another model (name or weights checksum)
or another scenario (name, or the sha256 of the scenario file or of its
prompt set): its counts would not mean the same thing.

    {"schema_version": 1, "kind": "eagle-parity-baseline", "package_version": "0.1.0",
     "model": {"name": ..., "checksum": ...},
     "scenario": {"name": ..., "path": ..., "sha256": ..., "prompts_sha256": ...},
     "backend": "emulated", "k": 3, "temperature": 0.0, "seed": 0,
     "modes": {"eager": {"num_drafts": 113, "accepted_per_position": [72, 45, 27],
                         "mean_acceptance_length": 2.274336}, ...}}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import parity
from parity.analysis.metrics import Acceptance
from parity.analysis.sources import AcceptanceRecord, from_acceptance
from parity.errors import ParityInputError

SCHEMA_VERSION = 1
KIND = "eagle-parity-baseline"
MAX_K = 32      # the engine's (engine/config.py, which analysis may not import): test_architecture checks


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def scenario_identity(scenario) -> dict:
    """Name, path and content hashes of a loaded scenario (what a baseline is tied to)."""
    return {"name": scenario.name, "path": scenario.path, "sha256": file_sha256(scenario.path),
            "prompts_sha256": file_sha256(scenario.prompts_file)}


def build_baseline(*, model: str, model_checksum: str, scenario, backend: str,
                   acceptance: dict[str, Acceptance]) -> dict:
    """Baseline data from one gate run's per-mode acceptance counts."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "package_version": parity.__version__,
        "model": {"name": model, "checksum": model_checksum},
        "scenario": scenario_identity(scenario),
        "backend": backend,
        "k": scenario.num_speculative_tokens,
        "temperature": scenario.temperature,
        "seed": scenario.seed,
        "modes": {mode: {"num_drafts": acc.num_drafts,
                         "accepted_per_position": list(acc.accepted_per_position),
                         "mean_acceptance_length": round(acc.mean_acceptance_length, 6)}
                  for mode, acc in acceptance.items()},
    }


def load_baseline(path: str | Path) -> dict:
    """Read and validate a baseline file; every problem is one ParityInputError line.

    Baselines are committed and hand-merged: a truncated file, another schema, a count that is not a
    count (a bool, a float, more accepted than drafted, rising with the position) is refused here,
    before any model loads, rather than surfacing later as a traceback or a meaningless verdict.
    """
    path = Path(path)
    try:
        if not path.is_file():
            raise ParityInputError(f"{path}: baseline not found (write one with --update-baseline)")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise ParityInputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        raise ParityInputError(f"{path}: unreadable ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ParityInputError(f"{path}: not an eagle-parity baseline (no \"kind\": \"{KIND}\")")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ParityInputError(f"{path}: baseline schema {repr(data.get('schema_version'))[:20]}, this version "
                               f"reads {SCHEMA_VERSION} (regenerate with --update-baseline)")
    k = data.get("k")
    if not _count(k) or not 1 <= k <= MAX_K:
        raise ParityInputError(f"{path}: 'k' must be an integer in 1..{MAX_K}, got {str(k)[:20]}")
    modes = data.get("modes")
    if not isinstance(modes, dict) or not modes:
        raise ParityInputError(f"{path}: baseline has no modes")
    for mode, m in modes.items():
        counts = m.get("accepted_per_position") if isinstance(m, dict) else None
        drafts = m.get("num_drafts") if isinstance(m, dict) else None
        if not _count(drafts) or drafts < 1 or not isinstance(counts, list) or len(counts) != k or \
                not all(_count(c) and c <= drafts for c in counts) or counts != sorted(counts, reverse=True):
            raise ParityInputError(f"{path}: mode {mode[:40]!r} needs num_drafts >= 1 and {k} "
                                   f"accepted_per_position counts within 0..num_drafts, non-increasing")
    for key in ("model", "scenario"):
        if not isinstance(data.get(key), dict):
            raise ParityInputError(f"{path}: baseline has no {key} object (regenerate with --update-baseline)")
    return data


def _count(value) -> bool:
    """A JSON integer that is a count: not a bool, and small enough that the statistics stay in floats."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 53


def check_scenario(data: dict, path: str | Path, scenario) -> None:
    """Refuse a baseline made for another scenario (name, file or prompt set)."""
    want, have = scenario_identity(scenario), data.get("scenario") or {}
    for key, what in (("name", "scenario"), ("sha256", "scenario file"), ("prompts_sha256", "prompt set")):
        if have.get(key) != want[key]:
            raise ParityInputError(
                f"{path}: baseline is for {what} {str(have.get(key))[:16]!r}, this run uses "
                f"{want[key][:16]!r} ({scenario.path}); refusing it (regenerate with --update-baseline)")


def check_model(data: dict, path: str | Path, model: str, checksum: str) -> None:
    """Refuse a baseline made with another model (name or weights checksum)."""
    have = data.get("model") or {}
    if have.get("name") != model or have.get("checksum") != checksum:
        raise ParityInputError(
            f"{path}: baseline is for model {have.get('name')!r} (checksum {have.get('checksum')}), this run "
            f"uses {model!r} (checksum {checksum}); refusing it (regenerate with --update-baseline)")


def baseline_records(data: dict, source: str = "") -> dict[str, AcceptanceRecord]:
    """Each mode of a baseline as an acceptance record labelled by its mode."""
    return {mode: from_acceptance(mode, "baseline", Acceptance(m["num_drafts"], tuple(m["accepted_per_position"])),
                                  source=source)
            for mode, m in data["modes"].items()}
