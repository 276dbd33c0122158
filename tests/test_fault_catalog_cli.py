"""`parity faults list`: every fault whole, with where it strikes, its report and where it shows."""

from __future__ import annotations

import io

from rich.console import Console

from parity.faults.catalog import FAULTS
from parity.report.catalog import fault_catalog


def render(width: int) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, force_terminal=False).print(fault_catalog(FAULTS.values()))
    return buffer.getvalue()


def test_names_are_never_cut_at_80_columns():
    lines = render(80).splitlines()
    for name, fault in FAULTS.items():
        head = next((line for line in lines if line.startswith(name + " ")), None)
        assert head is not None, f"{name} is not shown whole at the start of a line"
        assert fault.kind in head and f"seed {fault.seed}" in head


def test_each_entry_says_where_it_strikes_and_where_it_shows():
    text = render(120)
    blocks = text.split("\n\n")[1:]
    assert len(blocks) == len(FAULTS)
    for block, fault in zip(blocks, FAULTS.values()):
        flat = " ".join(block.split())
        assert f"strikes in {fault.site}" in flat
        assert f"scenario {fault.scenario}" in flat
        assert f"shows in {', '.join(fault.manifests_in)}" in flat
        assert " ".join(fault.description.split()) in flat


def test_each_entry_says_how_to_run_it_tensor_parallel_and_head_included():
    flat = " ".join(render(120).split())
    for fault in FAULTS.values():
        words = ["parity run", *(["--tp", str(fault.tp)] if fault.tp > 1 else []), *fault.args,
                 "--scenario", f"scenarios/{fault.scenario}.yaml", "--inject", fault.name]
        assert f"run it {' '.join(words)}" in flat, fault.name
        if fault.head:
            assert f"parity models synth --shape tiny --head {fault.head} --dtype float32" in flat, fault.name
    assert "parity run --tp 2 --tp-all-reduce registered" in flat
