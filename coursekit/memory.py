"""Peak memory of a call: NumPy's buffers as traced by Python's tracemalloc
(NumPy reports its allocations to it), plus the PyTorch tensors created during
the call. Inputs allocated before the call are not counted."""
import contextlib
import tracemalloc


@contextlib.contextmanager
def numpy_bytes_peak():
    """Yields a list that holds, on exit, the peak bytes traced inside the block."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    measured = []
    try:
        yield measured
        measured.append(max(tracemalloc.get_traced_memory()[1] - start, 0))
    finally:
        if not was_tracing:
            tracemalloc.stop()


def traced_peak(fn, *args, **kwargs):
    """(result, peak bytes allocated during fn(*args, **kwargs)). The NumPy and
    PyTorch peaks are added, an upper bound on the joint peak."""
    from coursekit.torch_memory import TorchTensorBytes, warm_up

    warm_up()  # PyTorch's first dispatch-mode call loads code; keep that out of the peak
    with TorchTensorBytes() as tensors, numpy_bytes_peak() as numpy_bytes:
        result = fn(*args, **kwargs)
    return result, numpy_bytes[0] + tensors.peak
