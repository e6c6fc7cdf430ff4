"""The calls a student's function makes to another of the student's functions,
recorded on the grader's side.

Chapter 2's decode_with_kv_cache must call decode_step once per generated
token, handing on the caches that the previous call returned. For the graded
call, decode_step in the function's globals is replaced by a grader function
(a callback, autograde.sandbox) that asks the student's own decode_step for
the step, records what it was given and what it returned, and hands back the
caches with the new row changed in its last bits. Caches that come back
bit for bit were passed on; caches rebuilt from x were not. Nothing of the
record lives in the student's process."""
import numpy as np

from autograde.compare import call
from autograde.sandbox import Remote

MARK_ULPS = 64  # how far the new cache row is moved: far below any tolerance, never reproduced by chance


def _marked(cache):
    """The cache with its last row moved by a few units in the last place."""
    cache = np.array(cache, dtype=np.float64, copy=True)
    if cache.ndim == 3 and cache.shape[1]:
        row = cache[:, -1]
        cache[:, -1] = row + MARK_ULPS * np.spacing(row)
    return cache


def counted_decode_steps(decode_with_kv_cache, x, *weights, what):
    """(output, calls) of decode_with_kv_cache(x, *weights) with each decode_step
    call recorded as (x_t, cache_k, cache_v, output_t, threaded): copies of what
    it was given and of the output it returned, and whether the caches it was
    given are, bit for bit, those the previous call handed back. A student's
    function is recorded through the sandbox; a local one (the references, the
    checks' own tests) through its module's globals, for the call's duration."""
    if isinstance(decode_with_kv_cache, Remote):
        sandbox = decode_with_kv_cache._sandbox
        step = sandbox.keep(Remote._for(sandbox, {"name": "decode_step"}, "function"))
    else:
        namespace = getattr(decode_with_kv_cache, "__globals__", {})
        step = namespace.get("decode_step")
        if not callable(step):
            return call(decode_with_kv_cache, x, *weights, what=what), []
    calls, handed = [], []

    def decode_step(x_t, cache_k, cache_v, *args, **kwargs):
        given = [np.array(a, dtype=np.float64, copy=True) for a in (x_t, cache_k, cache_v)]
        threaded = len(handed) == 2 and all(
            np.shape(a) == np.shape(b) and np.array_equal(a, b) for a, b in zip(given[1:], handed))
        result = step(x_t, cache_k, cache_v, *args, **kwargs)
        try:
            output_t = np.array(result[0], dtype=np.float64, copy=True)
            handed[:] = [_marked(result[1]), _marked(result[2])]
            result = (result[0], *handed, *result[3:])
        except Exception:  # a malformed result is judged by the caller's checks
            output_t = np.zeros(0)
            handed.clear()
        calls.append((*given, output_t, threaded))
        return result

    if isinstance(decode_with_kv_cache, Remote):
        found = call(lambda: sandbox.call(decode_with_kv_cache._target, (x, *weights), {},
                                          replace={"decode_step": decode_step}), what=what)
        return found, calls
    namespace["decode_step"] = decode_step
    try:
        found = call(decode_with_kv_cache, x, *weights, what=what)
    finally:
        namespace["decode_step"] = step
    return found, calls
