"""Hidden checks for Chapter 3 (Complexity)."""
import numpy as np

from autograde.compare import GradingFailure, call, call_unchanged, expect_close, expect_int, expect_value_error
from autograde.memory import traced_peak
from autograde.reference import complexity as ref

RNG_SEED = 20262


def _rng(offset=0):
    return np.random.default_rng(RNG_SEED + offset)


# ------------------------------------------------------------- counting

def check_attention_flops(attention_flops):
    for n, d in [(1, 1), (2, 3), (7, 5), (64, 64), (128, 64), (100, 3000), (4096, 128), (10**6, 4096), (10**9, 10**5)]:
        what = f"attention_flops(n={n}, d={d})"
        expect_int(call(attention_flops, n, d, what=what), ref.attention_flops(n, d), what=what,
                    hint="Four d x d projections cost 2·n·d·d each; QK^T and AV cost 2·n·n·d each. "
                         "Use integer arithmetic so huge sizes stay exact.")


def check_activation_bytes(attention_activation_bytes):
    for n, d, h, b in [(1, 1, 1, 1), (5, 8, 2, 4), (512, 768, 12, 2), (4096, 1024, 16, 2), (10**6, 4096, 32, 2),
                       (3, 10, 7, 8)]:
        what = f"attention_activation_bytes(n={n}, d={d}, h={h}, bytes_per_element={b})"
        expect_int(call(attention_activation_bytes, n, d, h, b, what=what),
                    ref.attention_activation_bytes(n, d, h, b), what=what,
                    hint="Q, K, V and the output hold 4·n·d elements; the h score matrices hold h·n·n.")


def check_receptive_field(receptive_field):
    for layers in range(0, 9):
        for width in (1, 2, 3, 5, 9):
            what = f"receptive_field(num_layers={layers}, kernel_width={width})"
            expect_int(call(receptive_field, layers, width, what=what), ref.receptive_field(layers, width),
                        what=what, hint="Each layer of width w adds w - 1 positions to what one output sees.")


# ------------------------------------------------------------- chunk length

def _need(c, d, h, b):
    return b * (4 * c * d + h * c * c)


def _check_chunk(max_chunk_length, budget, d, h, b, expected):
    what = f"max_chunk_length(budget_bytes={budget}, d={d}, h={h}, bytes_per_element={b})"
    expect_int(call(max_chunk_length, budget, d, h, b, what=what), expected, what=what,
                hint=f"c = {expected} needs {_need(expected, d, h, b)} bytes and c = {expected + 1} needs "
                     f"{_need(expected + 1, d, h, b)}; return the largest c that fits.")


def check_chunk_small(max_chunk_length):
    """Budgets exactly at, just below and just above every boundary for small c."""
    for d, h, b in [(1, 1, 1), (2, 3, 2), (8, 1, 4), (64, 12, 2), (5, 7, 1)]:
        for c in range(1, 40):
            exact = _need(c, d, h, b)
            for budget, expected in ((exact, c), (exact + 1, c), (_need(c + 1, d, h, b) - 1, c)):
                _check_chunk(max_chunk_length, budget, d, h, b, expected)
            if c > 1:
                _check_chunk(max_chunk_length, exact - 1, d, h, b, c - 1)


def check_chunk_huge(max_chunk_length):
    """The worked example (1 GiB, h=12, d=768, half precision) and boundaries with
    c up to 10^20, where floating-point square roots are off by more than one."""
    _check_chunk(max_chunk_length, 2**30, 768, 12, 2, ref.max_chunk_length(2**30, 768, 12, 2))
    for c in (10**6 + 3, 10**9 + 7, 10**12 + 39, 10**15 + 37, 10**18 + 3, 10**20 + 39):
        for d, h, b in [(768, 12, 2), (4096, 32, 4), (3, 1, 1)]:
            exact = _need(c, d, h, b)
            _check_chunk(max_chunk_length, exact, d, h, b, c)
            _check_chunk(max_chunk_length, exact - 1, d, h, b, c - 1)


def check_chunk_too_small(max_chunk_length):
    """A budget below what one token needs raises ValueError."""
    for budget, d, h, b in [(0, 8, 2, 2), (1, 1, 1, 2), (_need(1, 768, 12, 2) - 1, 768, 12, 2), (100, 64, 1, 4)]:
        expect_value_error(max_chunk_length, budget, d, h, b,
                           what=f"max_chunk_length(budget_bytes={budget}, d={d}, h={h}, bytes_per_element={b})",
                           reason=f"one token needs {_need(1, d, h, b)} bytes")


# ------------------------------------------------ local and linear attention

def _check_output(fn, inputs, expected, what, hint):
    expect_close(call_unchanged(fn, *inputs, what=what), expected, what=what, hint=hint)


LOCAL_HINT = ("Query i attends to keys j with |i - j| <= window (itself included), scores scaled by "
              "1/sqrt(d_k), softmax over those keys only.")


def check_local_output(local_attention):
    rng = _rng(1)
    for n, d_k, d_v, window in [(1, 3, 2, 0), (1, 3, 2, 4), (5, 4, 4, 0), (5, 4, 3, 1), (16, 8, 2, 3),
                                (9, 2, 5, 8), (7, 3, 3, 20), (33, 5, 4, 6)]:
        q, k, v = rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, d_v))
        _check_output(local_attention, (q, k, v, window), ref.local_attention(q, k, v, window),
                      f"local_attention for n={n}, d_k={d_k}, d_v={d_v}, window={window}", LOCAL_HINT)


def check_local_extreme(local_attention):
    rng = _rng(2)
    for scale in (30.0, 300.0):
        q, k, v = (rng.normal(scale=scale, size=(12, 4)), rng.normal(scale=scale, size=(12, 4)),
                   rng.normal(size=(12, 3)))
        _check_output(local_attention, (q, k, v, 2), ref.local_attention(q, k, v, 2),
                      f"local_attention with entries of size about {scale:g}",
                      "Use a numerically stable softmax (subtract the maximum of each query's scores).")


def _check_memory(fn, make_inputs, expected_fn, label, sizes=(1024, 4096)):
    """Peak traced memory must grow about linearly in n: from n to 4n, a linear
    algorithm's peak grows about 4x, one that builds an n x n array about 16x.
    The output must also be right at these sizes."""
    peaks = []
    for n in sizes:
        inputs = make_inputs(n)
        what = f"{label} for n={n}"
        found, peak = traced_peak(call, fn, *inputs, what=what)
        expect_close(found, expected_fn(*inputs), what=what)
        peaks.append(peak)
    growth = peaks[1] / max(peaks[0], 1)
    n_big = sizes[1]
    if peaks[1] >= n_big * n_big or growth > 8:
        raise GradingFailure(
            f"{label}: peak memory was {peaks[0] / 2**20:.2f} MiB for n={sizes[0]} and {peaks[1] / 2**20:.2f} MiB "
            f"for n={n_big} ({growth:.1f}x for 4x more tokens). Memory that grows like n^2 means an n x n array "
            "(scores, weights or a mask) is built somewhere; keep every intermediate O(n) in size.")


def check_local_memory(local_attention):
    rng = _rng(3)

    def inputs(n):
        return rng.normal(size=(n, 8)), rng.normal(size=(n, 8)), rng.normal(size=(n, 4)), 4

    _check_memory(local_attention, inputs, ref.local_attention, "local_attention with window=4, d_k=8, d_v=4")


LINEAR_HINT = ("phi(x) = elu(x) + 1 elementwise; output_i = phi(q_i) @ (phi(K)^T V) / (phi(q_i) · sum_j phi(k_j)); "
               "no 1/sqrt(d_k) and no softmax.")


def check_linear_output(linear_attention):
    rng = _rng(4)
    for n, d_k, d_v, scale in [(1, 3, 2, 1.0), (4, 1, 1, 1.0), (17, 8, 5, 1.0), (64, 4, 3, 2.0), (9, 6, 6, 0.1)]:
        q, k, v = (rng.normal(scale=scale, size=(n, d_k)), rng.normal(scale=scale, size=(n, d_k)),
                   rng.normal(size=(n, d_v)))
        _check_output(linear_attention, (q, k, v), ref.linear_attention(q, k, v),
                      f"linear_attention for n={n}, d_k={d_k}, d_v={d_v}", LINEAR_HINT)


def check_linear_extreme(linear_attention):
    """Entries from -15 to 1000: elu(x) + 1 stays positive, so nothing divides by 0.
    (Below about -15, elu(x) + 1 computed as expm1(x) + 1 loses digits, so
    equally correct implementations would disagree.)"""
    rng = _rng(5)
    cases = {
        "strongly negative queries and keys (phi near e^-15)": (-rng.uniform(10, 15, size=(6, 4)),
                                                               -rng.uniform(10, 15, size=(6, 4))),
        "large positive queries and keys": (rng.uniform(100, 1000, size=(6, 4)), rng.uniform(100, 1000, size=(6, 4))),
        "mixed signs and sizes": (rng.normal(scale=10, size=(6, 4)), rng.normal(scale=10, size=(6, 4))),
    }
    for label, (q, k) in cases.items():
        v = rng.normal(size=(6, 3))
        _check_output(linear_attention, (q, k, v), ref.linear_attention(q, k, v),
                      f"linear_attention with {label}", LINEAR_HINT)


def check_linear_memory(linear_attention):
    rng = _rng(6)

    def inputs(n):
        return rng.normal(size=(n, 8)), rng.normal(size=(n, 8)), rng.normal(size=(n, 4))

    _check_memory(linear_attention, inputs, ref.linear_attention, "linear_attention with d_k=8, d_v=4")
