"""The watcher's dispatch keys put back where an inference-mode guard took them off under it.

The read watcher (`lifetime.py`) is pushed inside the program's replay call,
often inside its `torch.inference_mode()` block; leaving that block restores
the thread's dispatch keys as they were on entry, without the keys that route
ops to the watcher, which then stays on the stack and sees nothing. At the
program's next torch call the `Rearm` function mode includes them again.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_PYTHON_KEYS = (torch._C.DispatchKey.Python, torch._C.DispatchKey.PythonTLSSnapshot)


class Rearm(TorchFunctionMode):
    """Includes the Python dispatch keys again, at every torch call, while `pushed()` says the watcher is on."""

    def __init__(self, pushed):
        super().__init__()
        self.pushed = pushed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # NOTE: nothing while dynamo traces (it would trace the key calls into the compiled code; compiled code
        # runs outside the watcher anyway).
        if not torch.compiler.is_compiling():
            rearm(self.pushed())
        return func(*args, **(kwargs or {}))


def rearm(pushed: bool) -> None:
    if pushed and torch._C._len_torch_dispatch_stack() \
            and not torch._C._dispatch_tls_is_dispatch_key_included(_PYTHON_KEYS[0]):
        for key in _PYTHON_KEYS:
            torch._C._dispatch_tls_set_dispatch_key_included(key, True)
