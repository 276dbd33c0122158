"""The speculators format of EAGLE-3 heads (`speculators_model_type: "eagle3"`): read as the published EAGLE-3
layout, with one-line errors for what it lacks."""

from __future__ import annotations

import pytest

from parity.errors import ParityInputError
from parity.models import loader
from parity.models.eagle3 import Eagle3Head
from test_eagle3 import DRAFT_VOCAB, LAYERS, assert_loaded, eagle3_state, published_config, target, write_checkpoint  # noqa: F401


def speculators_config(**top) -> dict:
    """A speculators config.json (the fields of RedHatAI's *.eagle3 heads) around the test's layer config."""
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "speculators_version": "0.1.0", "draft_vocab_size": DRAFT_VOCAB, "norm_before_residual": True,
            "transformer_layer_config": published_config(),
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
                                                "architectures": ["LlamaForCausalLM"]}},
            **top}


def speculators_state() -> dict:
    # speculators names the layer layers.0.* (vLLM reads it so), the rest as the published EAGLE-3 layout
    return {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
            for k, v in eagle3_state().items()}


def test_reads_the_speculators_eagle3_format(tmp_path, target):
    write_checkpoint(tmp_path / "spec", speculators_config(eagle_aux_hidden_state_layer_ids=[0, 4, LAYERS]),
                     speculators_state(), "safetensors")
    head = loader.load_head(tmp_path / "spec", target)
    assert isinstance(head, Eagle3Head) and head.midlayer.norm_before_residual
    assert target.aux_layers == (0, 4, LAYERS)
    assert head.config.draft_vocab_size == DRAFT_VOCAB
    assert head.config.speculators_verifier == "meta-llama/Llama-3.1-8B-Instruct"
    assert_loaded(head, eagle3_state())


@pytest.mark.parametrize("change, message", [
    ({"speculators_model_type": "mlp"}, "speculators_model_type 'mlp' is not supported"),
    ({"transformer_layer_config": None}, "needs 'transformer_layer_config'"),
    ({"speculators_config": {"proposal_methods": []}}, "needs 'speculators_config.verifier.name_or_path'"),
])
def test_a_broken_speculators_config_is_one_line(tmp_path, target, change, message):
    config = {k: v for k, v in {**speculators_config(), **change}.items() if v is not None}
    write_checkpoint(tmp_path / "spec", config, speculators_state(), "safetensors")
    with pytest.raises(ParityInputError, match=message) as error:
        loader.load_head(tmp_path / "spec", target)
    assert "\n" not in str(error.value) and "config.json" in str(error.value)
