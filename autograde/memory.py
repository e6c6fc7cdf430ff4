"""Peak memory of a call, as traced by Python's tracemalloc. NumPy reports its
array buffers to tracemalloc, so the peak includes every temporary array the
call creates (inputs allocated before the call are not counted)."""
import tracemalloc


def traced_peak(fn, *args, **kwargs):
    """(result, peak bytes allocated during fn(*args, **kwargs))."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    try:
        result = fn(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return result, max(peak - start, 0)
