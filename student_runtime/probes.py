"""Measurements taken in the student's process, where the student's code runs
(the grader asks for them with autograde.sandbox.in_student_process): peak
memory, Triton kernel launches and bytes, the PyTorch operators a launcher
used, the calls a function makes to a helper. They return what they saw; the
grader decides what it means. Nothing here knows an expected answer."""
import numpy as np

from coursekit.memory import numpy_bytes_peak, traced_peak  # noqa: F401  (traced_peak is asked for by name)
from student_runtime.calls import GradingFailure, call


def numpy_peak(fn, *args):
    """Peak bytes NumPy allocates while fn(*args) runs: what the notebooks'
    setup helper `peak_bytes` measures."""
    with numpy_bytes_peak() as numpy_bytes:
        fn(*args)
    return numpy_bytes[0]


def counting_decode_steps(decode_with_kv_cache, x, *weights, what):
    """(output, calls): decode_step is looked up in the function's own module
    and wrapped for the duration of the call; each call is recorded as
    (x_t, cache_k, cache_v, output_t): copies of what it was given and of the
    output it returned."""
    namespace = getattr(decode_with_kv_cache, "__globals__", {})
    step = namespace.get("decode_step")
    calls = []
    if callable(step):
        def counting_step(x_t, cache_k, cache_v, *args, **kwargs):
            given = [np.array(a, dtype=np.float64, copy=True) for a in (x_t, cache_k, cache_v)]
            result = step(x_t, cache_k, cache_v, *args, **kwargs)
            try:
                output_t = np.array(result[0], dtype=np.float64, copy=True)
            except Exception:  # a malformed result is judged by the caller's checks
                output_t = np.zeros(0)
            calls.append((*given, output_t))
            return result
        namespace["decode_step"] = counting_step
    try:
        found = call(decode_with_kv_cache, x, *weights, what=what)
    finally:
        if callable(step):
            namespace["decode_step"] = step
    return found, calls


# Operators that compute attention (or its products) in PyTorch instead of a kernel.
FORBIDDEN_OPS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "einsum", "softmax", "_softmax",
                 "log_softmax", "_log_softmax", "scaled_dot_product", "flash_attention", "efficient_attention")


def _forbidden(op_names):
    return sorted({name for name in op_names
                   if name in FORBIDDEN_OPS or "scaled_dot_product" in name or "attention" in name})


def flash_traced_call(flash_attention, q, k, v, causal, sm_scale, what):
    """Run the student's launcher under the kernel trace and the operator recorder.
    Returns (output, trace)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from coursekit.triton_trace import interpreting, trace_kernels

    class OperatorNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    kwargs = {"causal": causal} if sm_scale is None else {"causal": causal, "sm_scale": sm_scale}
    with trace_kernels() as trace, OperatorNames() as ops:
        out = call(flash_attention, q, k, v, what=what, **kwargs)
        if q.is_cuda:
            torch.cuda.synchronize()
    used = _forbidden(ops.names)
    if used:
        raise GradingFailure(f"{what} used PyTorch's {', '.join(used)}: the attention must be computed by your Triton "
                             "kernel; the launcher may only allocate the output (and the log-sum-exp) and launch it.")
    if trace.total_launches == 0:
        raise GradingFailure(f"{what} launched no Triton kernel: call your @triton.jit kernel as kernel[grid](...).")
    if interpreting():
        out_bytes = out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0
        if trace.bytes_stored < out_bytes or trace.bytes_loaded < q.numel() * q.element_size():
            raise GradingFailure(
                f"{what}: the Triton kernels loaded {trace.bytes_loaded} bytes and stored {trace.bytes_stored}, but "
                f"reading every query needs {q.numel() * q.element_size()} and writing the output {out_bytes}: "
                "the output must be computed and stored by your kernel (tl.load, tl.store).")
    return out, trace


def cuda_flash_peak(flash_attention, q, k, v, what):
    """(output, peak CUDA bytes beyond what was allocated before the call)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, _ = flash_traced_call(flash_attention, q, k, v, False, None, what)
    return out, torch.cuda.max_memory_allocated() - base


def torch_operators_used(fn, *args, what):
    """(result, names of the PyTorch operators that ran during fn(*args)): the
    NumPy exercises are graded as NumPy code, and PyTorch's own softmax or
    attention would answer them in one line."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperatorNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with OperatorNames() as ops:
        result = call(fn, *args, what=what)
    return result, sorted(ops.names)
