"""Following the memory of PyTorch tensors on the CPU. PyTorch allocates CPU
tensors outside Python's allocator, so tracemalloc does not see them; this
follows them through PyTorch's dispatcher instead. Kept apart from
coursekit.memory so that torch is imported only when needed."""
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class TorchTensorBytes(TorchDispatchMode):
    """Context manager that follows the bytes of the tensors PyTorch operators
    create while it is active: `live` is what they still hold, `peak` the most
    they held at any one moment. A result that shares storage with one of the
    operator's inputs (a view, an in-place update) is not new memory and is
    not counted."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._held = {}                                   # storage address -> bytes

    def _release(self, address):
        self.live -= self._held.pop(address)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        leaves = tree_leaves((args, kwargs))
        # A storage passed in directly (Tensor.set_, as Triton's interpreter does) is not new memory either.
        existing = {a.untyped_storage().data_ptr() for a in leaves if isinstance(a, torch.Tensor)}
        existing |= {a.data_ptr() for a in leaves if isinstance(a, torch.UntypedStorage)}
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            address = t.untyped_storage().data_ptr()
            if address in existing or address in self._held:
                continue
            self._held[address] = t.untyped_storage().nbytes()
            self.live += self._held[address]
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._release, address)   # called when t is freed
        return out


_warm = False


def warm_up():
    """Run one tiny operator under the mode, once: the first use loads code
    (tens of MB as tracemalloc sees it) that must not count as a peak."""
    global _warm
    if not _warm:
        with TorchTensorBytes():
            torch.zeros(2) + 1
        _warm = True
