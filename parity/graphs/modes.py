"""Graph modes with vLLM's CUDAGraphMode meaning, and capture sizes."""

from __future__ import annotations

from parity.errors import ParityInputError

EAGER, PIECEWISE, FULL = "eager", "piecewise", "full"
MODES = ("eager", "piecewise", "full", "full_decode_only", "full_and_piecewise")


def runtime_for(mode: str, uniform: bool) -> str:
    """Which runtime a batch gets under `mode` (before size limits)."""
    if mode == "eager":
        return EAGER
    if mode == "piecewise":
        return PIECEWISE
    if mode == "full":
        return FULL
    if mode == "full_decode_only":
        return FULL if uniform else EAGER
    if mode == "full_and_piecewise":
        return FULL if uniform else PIECEWISE
    raise ParityInputError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")


def fallback_for(mode: str) -> str:
    """The runtime of a non-uniform batch (also used when a uniform batch outgrows its graphs)."""
    return runtime_for(mode, False)


def default_capture_sizes(max_tokens: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, ... up to and including `max_tokens`."""
    sizes, s = [], 1
    while s < max_tokens:
        sizes.append(s)
        s *= 2
    sizes.append(max_tokens)
    return tuple(sizes)


def validate_capture_sizes(sizes) -> tuple[int, ...]:
    sizes = list(sizes)
    if not sizes:
        raise ParityInputError("capture sizes must not be empty")
    if any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ParityInputError(f"capture sizes must be positive integers, got {sizes}")
    if sizes != sorted(set(sizes)):
        raise ParityInputError(f"capture sizes must be strictly increasing, got {sizes}")
    return tuple(sizes)


# How a batch is shaped under a mode: padded in whole requests (a FULL uniform-decode
# graph), padded in tokens (PIECEWISE, or FULL for mixed batches), or run as it is.
REQUESTS, TOKENS, EXACT = "requests", "tokens", "exact"


def padding_signature(mode: str) -> tuple[str, str]:
    """(uniform batches, other batches): how `mode` pads each, which is all its padded reference depends on.

    Modes with the same signature pad every batch alike, so they share one strict reference.
    """
    def shape(runtime: str, uniform: bool) -> str:
        if runtime == EAGER:
            return EXACT
        return REQUESTS if runtime == FULL and uniform else TOKENS

    return shape(runtime_for(mode, True), True), shape(runtime_for(mode, False), False)
