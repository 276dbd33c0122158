"""A torch custom op that an unobserved eager call runs without the dispatcher.

Every call of a `torch.library.custom_op` goes through Python layers of the
dispatcher before its implementation runs: the autograd wrapper, a
redispatch, the backend lookup, dynamo's disable wrapper and an aliasing
check of the outputs. On an H100 host that was most of an eager 8B verify
forward's time (161 op calls, ~150 us each under cProfile, against a few
microseconds for the Triton launch inside), while the FULL graph replaying
the same kernels took a fifth of it.

A `DirectOp` is the custom op plus that shortcut: when nothing can observe
the call (no dispatch or function mode on the stack, no tracing, autograd
off, plain tensors only), it calls the implementation the op would have
dispatched to (the one registered for the first argument's device, else the
default) with the same arguments: the same kernels, the same results, bit for
bit. Whenever something does observe (a graph capture on the emulated
backend, the audit's tracers, a fake-tensor pass, torch.compile), the call
goes through the op and is seen as one op with its inputs and outputs.
"""

from __future__ import annotations

import functools

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def unobserved(args) -> bool:
    """Nothing but the caller sees this call: a custom op's dispatch would add nothing but time."""
    if torch.compiler.is_compiling() or torch.is_grad_enabled():
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    for a in args:
        if isinstance(a, torch.Tensor) and type(a) not in _PLAIN:
            return False
    return True


class DirectOp:
    """`torch.library.custom_op(name)` over `default`, called directly where the call is unobserved."""

    def __init__(self, name: str, default, mutates_args=()):
        self.op = torch.library.custom_op(name, mutates_args=mutates_args)(default)
        self.default = default
        self.kernels: dict[str, object] = {}
        functools.update_wrapper(self, default)

    def register_kernel(self, device_type: str):
        """Decorator: `fn` implements the op on `device_type` (the op's and the direct call's alike)."""
        def register(fn):
            self.op.register_kernel(device_type)(fn)
            self.kernels[device_type] = fn
            return fn
        return register

    def __call__(self, *args, **kwargs):
        if unobserved(args) and (not kwargs or unobserved(kwargs.values())):
            return self.kernels.get(args[0].device.type, self.default)(*args, **kwargs)
        return self.op(*args, **kwargs)
