"""The `speculators` format of EAGLE-3 heads (vLLM's speculators library; RedHatAI/*.eagle3), read as the
published EAGLE-3 layout.

Its config.json nests the layer's Llama config in `transformer_layer_config` and says what the head is at the
top: `speculators_model_type: "eagle3"`, `speculators_config` (the verifier's `name_or_path`, the proposal
methods), `draft_vocab_size`, and optionally `norm_before_residual`, `target_hidden_size` and
`eagle_aux_hidden_state_layer_ids`. `flatten` turns it into the flat EAGLE-3 config the loader reads (as
vLLM's SpeculatorsConfig does); its tensors (`layers.0.*` with `hidden_norm`, `fc`, `norm`, `lm_head`, `d2t`,
`t2d`) are the EAGLE-3 layout's already.
"""

from __future__ import annotations

from pathlib import Path

from parity.errors import ParityInputError

TYPE_KEY = "speculators_model_type"
# Top-level keys that belong to the head's flat config.
HEAD_KEYS = ("draft_vocab_size", "norm_before_residual", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")


def flatten(raw: dict, file: Path) -> dict:
    """`raw` unchanged unless it is a speculators config; then the flat EAGLE-3 config (one-line errors)."""
    if TYPE_KEY not in raw:
        return raw
    if raw[TYPE_KEY] != "eagle3":
        raise ParityInputError(f"{file}: {TYPE_KEY} {raw[TYPE_KEY]!r} is not supported (only 'eagle3' speculators "
                               f"heads are read)")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ParityInputError(f"{file}: a speculators config needs 'transformer_layer_config' (a JSON object: the "
                               f"draft layer's Llama config)")
    spec = raw.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    if not isinstance(verifier, dict) or not isinstance(verifier.get("name_or_path"), str):
        raise ParityInputError(f"{file}: a speculators config needs 'speculators_config.verifier.name_or_path'")
    flat = {**layer, **{k: raw[k] for k in HEAD_KEYS if raw.get(k) is not None}}
    flat["architectures"] = ["LlamaForCausalLMEagle3"]
    flat["speculators_verifier"] = verifier["name_or_path"]
    return flat
