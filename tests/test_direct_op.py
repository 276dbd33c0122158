"""`DirectOp`: the eager path skips the dispatcher only where nothing observes the call."""

from __future__ import annotations

import torch

from parity.models import fused_ops
from parity.models.direct_op import DirectOp, unobserved
from tests.dispatch_log import Seen

CALLS = []


def _double(x: torch.Tensor) -> torch.Tensor:
    CALLS.append("default")
    return x * 2


DOUBLE = DirectOp("parity_test::double", _double)


def test_unobserved_call_runs_the_implementation_without_the_dispatcher():
    x = torch.arange(4.0)
    CALLS.clear()
    with torch.no_grad():
        assert unobserved((x,))
        direct = DOUBLE(x)
        with Seen() as seen:
            via_op = DOUBLE(x)
    assert torch.equal(direct, via_op)
    assert CALLS == ["default", "default"]
    # Under a dispatch mode the call is the custom op, seen as one op with its inputs and output.
    assert seen.ops == ["parity_test.double.default"]


def test_unobserved_call_never_reaches_the_op(monkeypatch):
    def dispatched(*args):
        raise AssertionError("dispatched")

    monkeypatch.setattr(DOUBLE, "op", dispatched)
    with torch.no_grad():
        assert torch.equal(DOUBLE(torch.ones(2)), torch.full((2,), 2.0))
    try:
        DOUBLE(torch.ones(2))          # autograd on: through the op
    except AssertionError as error:
        assert str(error) == "dispatched"
    else:
        raise AssertionError("an observed call skipped the op")


def test_observers_take_the_op():
    x = torch.arange(4.0)
    assert not unobserved((x,))                 # autograd on: the op's dispatch decides
    with torch.no_grad():
        with Seen():
            assert not unobserved((x,))         # a dispatch mode
        with torch.device("meta"):              # a function mode (set_default_device's)
            assert not unobserved((x,))
        assert not unobserved((x.as_subclass(_Sub),))   # a tensor subclass may dispatch on its own
        assert unobserved((torch.nn.Parameter(x, requires_grad=False), 1.0))


class _Sub(torch.Tensor):
    pass


def test_registered_kernel_is_the_one_called_directly():
    calls = []
    op = DirectOp("parity_test::triple", _triple)

    @op.register_kernel("cpu")
    def _(x):
        calls.append("cpu")
        return x * 3

    with torch.no_grad():
        out = op(torch.ones(2))
    assert calls == ["cpu"] and torch.equal(out, torch.full((2,), 3.0))


def _triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def test_layer_ops_equal_with_and_without_the_dispatcher():
    """The layer's ops give the same bits called directly and through the op (the emulated capture's path)."""
    g = torch.Generator().manual_seed(0)
    x, res, w = (torch.randn(5, 64, generator=g) for _ in range(3))
    w = w[0]
    qk = torch.randn(5, 6, 16, generator=g)
    cos, sin = torch.randn(5, 16, generator=g), torch.randn(5, 16, generator=g)
    calls = [(fused_ops.rms_norm, (x, w, 1e-5)), (fused_ops.add_rms_norm, (x, res, w, 1e-5)),
             (fused_ops.rope, (qk, cos, sin)), (fused_ops.silu_and_mul, (x,))]
    with torch.no_grad():
        for op, args in calls:
            direct = op(*args)
            with Seen() as seen:
                dispatched = op(*args)
            assert seen.ops and seen.ops[0].startswith("parity.")
            for a, b in zip(direct if isinstance(direct, tuple) else (direct,),
                            dispatched if isinstance(dispatched, tuple) else (dispatched,)):
                assert torch.equal(a, b)
