"""What the overlapped-loop tests share: tiny runs of the synchronous and the overlapped loop, on either backend."""

from __future__ import annotations

from conftest import engine_config, make_specs
from parity.engine.overlap import OverlapEngine
from parity.engine.parts import EngineParts
from parity.engine.spec_decode import SpecDecodeEngine
from parity.engine.staging import Stager
from parity.graphs.factory import install_graphs

K = 3
CFG = dict(num_speculative_tokens=K, max_num_seqs=3, max_num_batched_tokens=32, block_size=4)
CAPTURE_SIZES = (4, 12)
SPECS = make_specs(4, seed=21, max_tokens=6, max_prompt=9, stagger=1, avoid_prompt_len=K + 1)


def run(pair, mode: str, overlap: bool, specs=SPECS, stager=Stager, sync=None, device="cpu", **cfg):
    """One run of `specs` in `mode`; overlapped with `stager` (a Stager class) and its `sync` experiment."""
    config = engine_config(**{**CFG, **cfg})
    if overlap:
        engine = OverlapEngine(*pair, config, device, EngineParts(stager=stager), sync)
    else:
        engine = SpecDecodeEngine(*pair, config, device)
    if mode != "eager":
        install_graphs(engine, mode, "cuda" if str(device).startswith("cuda") else "emulated",
                       capture_sizes=CAPTURE_SIZES)
    return engine.run(specs), engine


def with_mixin(mixin) -> type:
    return type(f"{mixin.__name__}Stager", (mixin, Stager), {})


def same_records(a, b) -> bool:
    """Bit for bit the same tokens, drafts and forwards (frames and outputs)."""
    return (a.outputs == b.outputs and a.tokens.equals(b.tokens) and a.drafts.equals(b.drafts)
            and a.forwards.equals(b.forwards))
