"""Nothing the audit is told is silently ignored: options, configure timing, the plugin's name, capture blocks."""

from __future__ import annotations

import dataclasses
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

from forked_pytest import pytest_in_fork
from parity.audit import AuditSession, GraphAudit, auto_audit, emulated
from parity.audit.auto import CaptureNotAudited
from parity.audit.options import AuditConfigError

ROOT = Path(__file__).resolve().parents[1]


class Step:
    def __init__(self):
        self.x = torch.arange(4.0)
        self.w = torch.nn.Linear(4, 4)

    def forward(self):
        return self.w(self.x) * 2


def test_an_unknown_option_is_one_line_naming_it_and_the_known_ones():
    with pytest.raises(AuditConfigError) as caught:
        GraphAudit(Step().forward, name="s", num_vaild=3)
    message = str(caught.value)
    assert "\n" not in message and "'num_vaild'" in message and "num_valid" in message and "every" in message


def test_configure_after_a_capture_is_an_error_that_says_what_to_do():
    step = Step()
    with auto_audit() as session:
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            step.forward()
        with pytest.raises(AuditConfigError, match="before the engine captures"):
            session.configure = lambda fn, args: {"num_valid": 2}
    late = AuditSession()
    late.configure = lambda fn, args: {"num_valid": 2}     # a later session (test) that captured nothing
    with late.auto(), pytest.raises(AuditConfigError, match="set after"):
        graph.replay()


def test_a_block_with_a_helper_call_audits_the_call_that_launches_kernels():
    step = Step()

    def keep(t):                 # a view-making helper, as vLLM's weak_ref_tensors: launches nothing
        return t.view(-1)
    with auto_audit() as session:
        graph = emulated.CUDAGraph()
        with emulated.graph(graph), torch.device("cpu"):   # torch's own device hook is no call
            out = keep(step.forward())
        step.x.copy_(torch.ones(4))
        graph.replay()
    assert [a.fn for a in session.audits] == [step.forward] and out.shape == (4,)


def test_a_block_with_two_callables_fails_loudly():
    a, b = Step(), Step()
    with auto_audit(), pytest.raises(CaptureNotAudited, match="wrap the block's body in one function") as caught:
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            a.forward()
            b.forward()
    assert "Step.forward, Step.forward launch kernels" in str(caught.value)
    with auto_audit(), pytest.raises(CaptureNotAudited, match="calls no Python function"):
        with emulated.graph(emulated.CUDAGraph()):
            torch.ones(2) * 2


def test_buffers_are_named_by_their_shortest_path_and_weights_are_never_not_refreshed():
    class Runner:
        pass
    step = Step()
    step.runner = Runner()
    step.runner.engine = step                      # a back-reference
    audit = GraphAudit(step.forward, name="s", static_inputs={"step": step}, every=0, not_refreshed_after=1)
    graph = emulated.CUDAGraph()
    with emulated.graph(graph):
        audit()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for _ in range(2):
            graph.replay()
    names = [r.name for r in audit.record.roles]
    assert not any("runner" in n for n in names), names
    assert [f["buffers"] for f in audit.findings] == [["static['step'].x"]]     # not the Linear's weight


def test_a_context_without_metadata_at_capture_is_said_in_the_diagnosis():
    @dataclasses.dataclass
    class Context:                                   # vLLM's ForwardContext is a dataclass
        attn_metadata: object = None
    ctx = Context()

    def forward(x):
        scale = ctx.attn_metadata if ctx.attn_metadata is not None else torch.ones(4)
        return x * scale
    x = torch.arange(4.0)
    audit = GraphAudit(forward, name="f", static_inputs={"forward_context": lambda: ctx}, on_mismatch="record")
    graph = emulated.CUDAGraph()
    with emulated.graph(graph):
        audit(x)
    ctx.attn_metadata = torch.full((4,), 3.0)
    graph.replay()
    evidence = audit.errors[0].diagnosis["evidence"]
    assert any("static['forward_context'].attn_metadata was None when the graph was captured" in e
               for e in evidence), evidence


def test_the_plugin_entry_point_has_the_module_name_so_dash_p_loads_it_once(tmp_path, monkeypatch):
    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert points == {"parity.audit.pytest_plugin": "parity.audit.pytest_plugin"}
    # An install with that entry point, then `-p` naming the module: loaded once, no "already registered".
    dist = tmp_path / "site" / "eagle_parity_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: eagle-parity-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nparity.audit.pytest_plugin = parity.audit.pytest_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "test_probe.py").write_text("def test_probe(graph_audit):\n    assert graph_audit.errors == []\n")
    # NOTE: `no:parity_audit` blocks the entry point of an install made before it was renamed.
    for extra in ([], ["-p", "parity.audit.pytest_plugin"]):
        code, output = pytest_in_fork([str(tmp_path / "test_probe.py"), "-q", "-p", "no:parity_audit", *extra],
                                      tmp_path / "probe.log")
        assert code == 0, (extra, output[-2000:])


def test_a_descriptor_key_is_shown_by_the_fields_that_tell_the_keys_apart():
    from parity.audit.locate import key_text

    @dataclasses.dataclass(frozen=True)
    class Descriptor:
        num_tokens: int
        uniform: bool = True

    keys = [Descriptor(8), Descriptor(4), Descriptor(4, False)]
    assert [key_text(k, keys) for k in keys] == ["num_tokens=8, uniform=True", "num_tokens=4, uniform=True",
                                                 "num_tokens=4, uniform=False"]
    assert key_text(keys[0], keys[:2]) == "num_tokens=8"
    assert key_text(keys[0], keys[:1]) == "num_tokens=8, uniform=True"      # one key: every field
    assert key_text(("draft", 4), [("draft", 4)]) == "('draft', 4)"
