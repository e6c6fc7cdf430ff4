"""Measurements taken in the student's process, where the student's code runs
(the grader asks for them with autograde.sandbox.in_student_process): peak
memory as the process sees it, Triton kernel launches and bytes, the PyTorch
operators a launcher used. They return what they saw; the grader decides what
it means, and checks what it can from outside (autograde.memory,
autograde.recorded_calls, the process without PyTorch). Nothing here knows an
expected answer."""
import contextlib

import numpy as np

from coursekit.memory import numpy_bytes_peak, traced_peak
from student_runtime.calls import GradingFailure, call
from student_runtime.wire import real_torch


def inside_numpy_peak(fn, *args, **kwargs):
    """(result, peak bytes NumPy allocates during fn(*args, **kwargs)): what
    the notebooks' setup helper `peak_bytes` measures."""
    with numpy_bytes_peak() as numpy_bytes:
        result = fn(*args, **kwargs)
    return result, numpy_bytes[0]


def inside_peak(fn, *args, **kwargs):
    """(result, peak bytes that NumPy, and PyTorch where it exists, allocate
    during fn(*args, **kwargs)), as seen from inside this process: the
    grader's measurement from outside (autograde.memory) is the one it trusts;
    this one explains a small peak to the byte."""
    if real_torch() is None:  # the process without PyTorch
        return inside_numpy_peak(fn, *args, **kwargs)
    return traced_peak(fn, *args, **kwargs)


# Operators that compute attention (or its products) in PyTorch instead of a kernel.
FORBIDDEN_OPS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "einsum", "softmax", "_softmax",
                 "log_softmax", "_log_softmax", "scaled_dot_product", "flash_attention", "efficient_attention")


def _forbidden(op_names):
    return sorted({name for name in op_names
                   if name in FORBIDDEN_OPS or "scaled_dot_product" in name or "attention" in name})


# ---------------------------------------------------------------- Chapter 4: backward pass and decoding

def _checked_kernels(what, ops, trace, stored_at_least, loaded_at_least):
    """Shared rules for a launcher graded as Triton kernels: no attention or matrix
    product in PyTorch, at least one launch, and (interpreter) the outputs stored by kernels."""
    from coursekit.triton_trace import interpreting

    used = _forbidden(ops.names)
    if used:
        raise GradingFailure(f"{what} used PyTorch's {', '.join(used)}: the computation must be done by your Triton "
                             "kernels; the launcher may only allocate buffers and launch them.")
    if trace.total_launches == 0:
        raise GradingFailure(f"{what} launched no Triton kernel: call your @triton.jit kernels as kernel[grid](...).")
    borrowed = sorted(m for m in trace.modules if m and m.split(".")[0] in ("bookutils", "coursekit"))
    if borrowed:
        raise GradingFailure(f"{what} launched kernels of the book's modules ({', '.join(borrowed)}): the exercise "
                             "asks for kernels you write; define them with @triton.jit in your notebook.")
    shared = {name: count for name, count in trace.shared_stores.items() if count}
    if interpreting() and shared:
        name, count = next(iter(shared.items()))
        raise GradingFailure(
            f"{what}: in one launch of {name}, {count} addresses were written with tl.store by more than one "
            "program. On a GPU the programs of a launch run at the same time, so such writes (and a "
            "tl.load followed by tl.store of a sum) lose each other's updates. Give every program its own "
            "outputs, or add into shared ones with tl.atomic_add.")
    if interpreting() and (trace.bytes_stored < stored_at_least or trace.bytes_loaded < loaded_at_least):
        raise GradingFailure(
            f"{what}: the Triton kernels loaded {trace.bytes_loaded} bytes and stored {trace.bytes_stored}, but "
            f"reading the inputs needs at least {loaded_at_least} and writing the results {stored_at_least}: the "
            "results must be computed and stored by your kernels (tl.load, tl.store).")


def _operator_recorder():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperatorNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()
            self.largest = 0            # bytes of the largest tensor an operator returned
            self.shapes = set()         # the shapes of the tensors operators returned

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            result = func(*args, **(kwargs or {}))
            for out in result if isinstance(result, (tuple, list)) else (result,):
                if isinstance(out, torch.Tensor):
                    self.largest = max(self.largest, out.numel() * out.element_size())
                    self.shapes.add(tuple(out.shape))
            return result

    return OperatorNames()


def _nbytes(t):
    return t.numel() * t.element_size()


@contextlib.contextmanager
def _flipped_loads(tensor, signs):
    """Under the interpreter: every element a Triton kernel loads from `tensor`'s
    memory comes back multiplied by the matching entry of `signs` (+1 or -1, the
    tensor's shape). What the kernels compute then follows these changed values,
    while anything computed on the host from the tensor itself does not."""
    if signs is None:
        yield
        return
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_masked_load
    base, size = tensor.data_ptr(), tensor.element_size()
    flat = np.ascontiguousarray(np.asarray(signs).reshape(-1))

    def masked_load(self, ptrs, mask, other, *rest):
        result = original(self, ptrs, mask, other, *rest)
        offset = np.asarray(ptrs.data).astype(np.int64) - base
        inside = np.asarray(mask.data, dtype=bool) & (offset >= 0) & (offset < flat.size * size)
        if inside.any():
            result.data[inside] = result.data[inside] * flat[offset[inside] // size].astype(result.data.dtype)
        return result

    builder.create_masked_load = masked_load
    try:
        yield
    finally:
        builder.create_masked_load = original


def backward_traced_call(flash_attention_backward, q, k, v, o, lse, do, causal, sm_scale, what, flip_k=None,
                         shared_stores=True):
    """Run the student's backward launcher under the kernel trace and the operator
    recorder (and, given flip_k, with the signs of the keys the kernels load
    flipped there). Returns (dq, dk, dv) as given back (checked by the grader).
    shared_stores=False leaves out the record of store addresses, for calls
    whose memory is measured."""
    import torch

    from coursekit.triton_trace import trace_kernels

    kwargs = {"causal": causal} if sm_scale is None else {"causal": causal, "sm_scale": sm_scale}
    with trace_kernels(shared_stores) as trace, _operator_recorder() as ops, _flipped_loads(k, flip_k):
        grads = call(flash_attention_backward, q, k, v, o, lse, do, what=what, **kwargs)
        if q.is_cuda:
            torch.cuda.synchronize()
    _checked_kernels(what, ops, trace, _nbytes(q) + _nbytes(k) + _nbytes(v), _nbytes(q) + _nbytes(do))
    # With N > 2D no buffer the size of the inputs (or of a float32 copy) has N x N entries for
    # every head, or two axes of length N: such a tensor holds P, dP or dS.
    batch, heads, n, d = q.shape
    square = [shape for shape in ops.shapes if sum(size == n for size in shape) >= 2]
    if n > 2 * d and (square or ops.largest >= batch * heads * n * n * q.element_size()):
        found = f"a tensor of shape {square[0]}" if square else f"a tensor of {ops.largest} bytes"
        raise GradingFailure(
            f"{what}: the launcher made {found}, the size of an N x N matrix (N = {n}). FlashAttention's backward "
            "keeps P, dP and dS as tiles inside the kernels: allocate only buffers of the size of the inputs.")
    return grads


def cuda_backward_peak(flash_attention_backward, q, k, v, o, lse, do, what):
    """(gradients, peak CUDA bytes beyond what was allocated before the call)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    grads = backward_traced_call(flash_attention_backward, q, k, v, o, lse, do, False, None, what)
    return grads, torch.cuda.max_memory_allocated() - base


def decode_traced_call(decode_attention, q, k_cache, v_cache, cache_lens, sm_scale, what, flip_k=None):
    """Run the student's decoding launcher under the kernel trace and the operator
    recorder (and, given flip_k, with the signs of the cached keys the kernels
    load flipped there), noting every launch. Returns (output, launches): one
    (programs, bytes loaded, bytes stored) per launch, in order; the bytes are
    counted under the interpreter only (None on a GPU)."""
    import math

    import torch

    from coursekit.triton_trace import interpreting, trace_kernels

    launches = []
    traces = []
    if interpreting():
        from triton.runtime import interpreter

        owner, name = interpreter.InterpreterBuilder, "set_grid_dim"
        original = owner.set_grid_dim

        def recording(self, nx, ny, nz):
            # The interpreter runs one launch at a time: what the trace counts from
            # here to the next launch is this launch's.
            trace = traces[0]
            launches.append([nx * ny * nz, trace.bytes_loaded, trace.bytes_stored])
            return original(self, nx, ny, nz)
    else:
        import triton.runtime.jit as jit

        owner, name = jit.JITFunction, "run"
        original = owner.run

        def recording(self, *args, grid, warmup, **kwargs):
            if not warmup:
                shape = grid(kwargs) if callable(grid) else grid
                shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
                launches.append([math.prod(int(g) for g in shape), None, None])
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
    setattr(owner, name, recording)
    kwargs = {} if sm_scale is None else {"sm_scale": sm_scale}
    try:
        with trace_kernels() as trace, _operator_recorder() as ops, _flipped_loads(k_cache, flip_k):
            traces.append(trace)
            out = call(decode_attention, q, k_cache, v_cache, cache_lens, what=what, **kwargs)
            if q.is_cuda:
                torch.cuda.synchronize()
    finally:
        setattr(owner, name, original)
    if interpreting():
        ends = [(later[1], later[2]) for later in launches[1:]] + [(trace.bytes_loaded, trace.bytes_stored)]
        launches = [(programs, end[0] - loaded, end[1] - stored)
                    for (programs, loaded, stored), end in zip(launches, ends)]
    else:
        launches = [tuple(launch) for launch in launches]
    stored = _nbytes(out) if isinstance(out, torch.Tensor) else _nbytes(q)
    _checked_kernels(what, ops, trace, stored, _nbytes(q))
    return out, launches


def torch_operators_used(fn, *args, what):
    """(result, names of the PyTorch operators that ran during fn(*args)): the
    NumPy exercises are graded as NumPy code, and PyTorch's own softmax or
    attention would answer them in one line."""
    with _operator_recorder() as ops:
        result = call(fn, *args, what=what)
    return result, sorted(ops.names)
