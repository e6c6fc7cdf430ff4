"""Hidden checks for Chapter 3 (Complexity)."""
import numpy as np

from autograde.compare import (GradingFailure, call, call_unchanged, expect_close, expect_int, expect_value_error,
                               numpy_only)
from autograde.memory import traced_peak
from autograde.reference import complexity as ref

RNG_SEED = 20262


def _rng(offset=0):
    return np.random.default_rng(RNG_SEED + offset)


# ------------------------------------------------------------- counting

TRAINING_HINT = ("Forward: Q, K, V and the output projection cost 2·n·d_model·(heads·d_head) each; per head, "
                 "QK^T and AV cost 2·n·n·d_head each. Backward: each product needs the gradient of both of its "
                 "inputs, two more products of the same cost. Use integers so huge sizes stay exact.")


def check_training_flops(training_flops):
    for n, d_model, heads, d_head in [(1, 1, 1, 1), (2, 3, 1, 3), (7, 5, 2, 4), (64, 64, 8, 8), (128, 96, 4, 32),
                                      (100, 3000, 24, 128), (4096, 4096, 32, 128), (10**6, 8192, 64, 160),
                                      (10**9, 10**5, 7, 3)]:
        what = f"training_flops(n={n}, d_model={d_model}, heads={heads}, d_head={d_head})"
        expect_int(call(training_flops, n, d_model, heads, d_head, what=what),
                   ref.training_flops(n, d_model, heads, d_head), what=what, hint=TRAINING_HINT)
    numpy_only(training_flops, 64, 48, 4, 16, what="training_flops(n=64, d_model=48, heads=4, d_head=16)")


RECEPTIVE_HINT = ("Layer l of width w and dilation δ spans (w - 1)·δ positions of its own input; with strides "
                  "s_1, s_2, ... below it, neighbouring positions of that input lie s_1·s_2·...·s_(l-1) input "
                  "positions apart. The top layer's own stride changes nothing for one of its outputs.")


def check_receptive_field(receptive_field):
    cases = [([], [], []), ([3], [1], [1]), ([2, 2, 2], [1, 2, 4], [1, 1, 1]), ([3, 3, 3, 3], [1, 3, 9, 27], [1] * 4),
             ([5, 1, 4], [2, 7, 3], [1, 1, 1]), ([2] * 10, [1] * 10, [1] * 10), ([7, 3], [1, 1], [1, 1]),
             ([4, 4, 4], [5, 1, 5], [1, 1, 1]), ([9], [100], [7]), ([3, 3], [1, 1], [2, 1]), ([2, 2, 2], [1, 1, 1], [2, 2, 2]),
             ([5, 3, 4], [2, 1, 3], [3, 2, 5]), ([4, 1, 3], [2, 5, 1], [1, 3, 2]), ([2] * 10, [1] * 10, [2] * 10),
             ([3, 2, 2, 2], [1, 2, 1, 3], [2, 1, 3, 1]), ([2, 2], [1, 1], [1, 1000])]
    for widths, dilations, strides in cases:
        what = f"receptive_field(kernel_widths={widths}, dilations={dilations}, strides={strides})"
        expect_int(call(receptive_field, list(widths), list(dilations), list(strides), what=what),
                   ref.receptive_field(widths, dilations, strides), what=what, hint=RECEPTIVE_HINT)
    numpy_only(receptive_field, [3, 2, 5], [1, 4, 2], [2, 1, 3],
               what="receptive_field(kernel_widths=[3, 2, 5], dilations=[1, 4, 2], strides=[2, 1, 3])")


# ------------------------------------------------------------- chunk length

def _check_chunk(max_chunk_length, budget, shape, expected):
    heads, groups, d_head, b, s = shape
    what = (f"max_chunk_length(budget_bytes={budget}, heads={heads}, groups={groups}, d_head={d_head}, "
            f"bytes_per_element={b}, score_bytes={s})")
    expect_int(call(max_chunk_length, budget, *shape, what=what), expected, what=what,
               hint=f"c = {expected} needs {ref.chunk_bytes(expected, *shape)} bytes and c = {expected + 1} needs "
                    f"{ref.chunk_bytes(expected + 1, *shape)}; return the largest c that fits.")


SMALL_SHAPES = [(1, 1, 1, 1, 1), (3, 1, 2, 2, 4), (8, 8, 1, 4, 4), (12, 4, 64, 2, 4), (7, 7, 5, 1, 2),
                (4, 2, 3, 2, 2)]
HUGE_SHAPES = [(12, 4, 64, 2, 4), (32, 8, 128, 2, 2), (1, 1, 3, 1, 1), (64, 1, 80, 2, 4)]


def _chunk_numpy_only(max_chunk_length):
    shape = (12, 4, 64, 2, 4)
    numpy_only(max_chunk_length, 2**30, *shape, what=f"max_chunk_length(budget_bytes={2**30}, heads, groups, d_head, "
                                                     f"bytes_per_element, score_bytes = {shape})")


def check_chunk_small(max_chunk_length):
    """Budgets exactly at, just below and just above every boundary for small c."""
    for shape in SMALL_SHAPES:
        for c in range(1, 41):
            exact = ref.chunk_bytes(c, *shape)
            for budget, expected in ((exact, c), (exact + 1, c), (ref.chunk_bytes(c + 1, *shape) - 1, c)):
                _check_chunk(max_chunk_length, budget, shape, expected)
            if c > 1:
                _check_chunk(max_chunk_length, exact - 1, shape, c - 1)
    _chunk_numpy_only(max_chunk_length)


def check_chunk_huge(max_chunk_length):
    """One GiB for 12 query heads in 4 groups, and boundaries with c up to 10^20,
    where floating-point square roots are off by more than one."""
    shape = (12, 4, 64, 2, 4)
    _check_chunk(max_chunk_length, 2**30, shape, ref.max_chunk_length(2**30, *shape))
    for c in (10**6 + 3, 10**9 + 7, 10**12 + 39, 10**15 + 37, 10**18 + 3, 10**20 + 39):
        for shape in HUGE_SHAPES:
            exact = ref.chunk_bytes(c, *shape)
            _check_chunk(max_chunk_length, exact, shape, c)
            _check_chunk(max_chunk_length, exact - 1, shape, c - 1)
    _chunk_numpy_only(max_chunk_length)


def check_chunk_too_small(max_chunk_length):
    """A budget below what one token needs raises ValueError."""
    for budget, shape in [(0, (2, 1, 8, 2, 4)), (1, (1, 1, 1, 2, 2)),
                          (ref.chunk_bytes(1, 12, 4, 64, 2, 4) - 1, (12, 4, 64, 2, 4)), (100, (1, 1, 64, 4, 4))]:
        expect_value_error(max_chunk_length, budget, *shape,
                           what=f"max_chunk_length(budget_bytes={budget}, heads, groups, d_head, "
                                f"bytes_per_element, score_bytes = {shape})",
                           reason=f"one token needs {ref.chunk_bytes(1, *shape)} bytes")
    _chunk_numpy_only(max_chunk_length)


# ------------------------------------------------ dilated and causal linear attention

def _check_output(fn, inputs, expected, what, hint):
    expect_close(call_unchanged(fn, *inputs, what=what), expected, what=what, hint=hint)


def _check_memory(fn, make_inputs, expected_fn, label, sizes=(1024, 4096)):
    """Peak traced memory must grow about linearly in n: from n to 4n, a linear
    algorithm's peak grows about 4x, one that builds an n x n array about 16x.
    The output must also be right at these sizes."""
    peaks = []
    for n in sizes:
        inputs = make_inputs(n)
        expected = expected_fn(*inputs)
        what = f"{label} for n={n}"
        found, peak = traced_peak(call, fn, *inputs, what=what)
        expect_close(found, expected, what=what)
        peaks.append(peak)
    growth = peaks[1] / max(peaks[0], 1)
    n_big = sizes[1]
    if peaks[1] >= n_big * n_big or growth > 8:
        raise GradingFailure(
            f"{label}: peak memory was {peaks[0] / 2**20:.2f} MiB for n={sizes[0]} and {peaks[1] / 2**20:.2f} MiB "
            f"for n={n_big} ({growth:.1f}x for 4x more tokens). Memory that grows like n^2 means an n x n array "
            "(scores, weights or a mask) is built somewhere; keep every intermediate O(n) in size.")


DILATED_HINT = ("Query i attends to the keys j = i + m·dilation with |m| <= radius that exist (0 <= j < n), itself "
                "included; scores scaled by 1/sqrt(d_k), softmax over those keys only.")


def _dilated_numpy_only(dilated_local_attention, rng):
    q, k, v = rng.normal(size=(9, 3)), rng.normal(size=(9, 3)), rng.normal(size=(9, 2))
    numpy_only(dilated_local_attention, q, k, v, 2, 2, what="dilated_local_attention for n=9, radius=2, dilation=2")


def check_dilated_output(dilated_local_attention):
    rng = _rng(1)
    for n, d_k, d_v, radius, dilation in [(1, 3, 2, 0, 1), (1, 3, 2, 4, 3), (5, 4, 4, 0, 2), (5, 4, 3, 1, 1),
                                          (16, 8, 2, 3, 2), (9, 2, 5, 8, 3), (7, 3, 3, 20, 1), (33, 5, 4, 2, 5),
                                          (20, 3, 2, 3, 19), (20, 3, 2, 2, 40), (31, 4, 3, 4, 4)]:
        q, k, v = rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, d_v))
        _check_output(dilated_local_attention, (q, k, v, radius, dilation),
                      ref.dilated_local_attention(q, k, v, radius, dilation),
                      f"dilated_local_attention for n={n}, d_k={d_k}, d_v={d_v}, radius={radius}, "
                      f"dilation={dilation}", DILATED_HINT)
    _dilated_numpy_only(dilated_local_attention, rng)


GLOBAL_HINT = ("The first n_global tokens are global: a global query attends to every key, and every other query "
               "attends to its dilated window and to all the global keys, a global key inside the window counted "
               "once. n_global may exceed n (then every token is global).")


def check_dilated_global(dilated_local_attention):
    rng = _rng(8)
    for n, d_k, d_v, radius, dilation, n_global in [(1, 3, 2, 0, 1, 1), (6, 4, 2, 0, 1, 1), (9, 3, 3, 1, 2, 2),
                                                    (16, 8, 2, 3, 2, 3), (12, 2, 4, 2, 3, 5), (7, 3, 3, 20, 1, 2),
                                                    (33, 5, 4, 2, 5, 4), (5, 3, 2, 1, 2, 9), (20, 3, 2, 3, 19, 1)]:
        q, k, v = rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, d_v))
        _check_output(dilated_local_attention, (q, k, v, radius, dilation, n_global),
                      ref.dilated_local_attention(q, k, v, radius, dilation, n_global),
                      f"dilated_local_attention for n={n}, d_k={d_k}, d_v={d_v}, radius={radius}, "
                      f"dilation={dilation}, n_global={n_global}", GLOBAL_HINT)
    _dilated_numpy_only(dilated_local_attention, rng)


def check_dilated_extreme(dilated_local_attention):
    rng = _rng(2)
    for scale in (30.0, 300.0):
        q, k, v = (rng.normal(scale=scale, size=(14, 4)), rng.normal(scale=scale, size=(14, 4)),
                   rng.normal(size=(14, 3)))
        _check_output(dilated_local_attention, (q, k, v, 2, 3), ref.dilated_local_attention(q, k, v, 2, 3),
                      f"dilated_local_attention with entries of size about {scale:g}",
                      "Use a numerically stable softmax (subtract the maximum of each query's scores).")
    _dilated_numpy_only(dilated_local_attention, rng)


def check_dilated_memory(dilated_local_attention):
    rng = _rng(3)

    def inputs(n):
        return rng.normal(size=(n, 8)), rng.normal(size=(n, 8)), rng.normal(size=(n, 4)), 4, 3, 2

    _check_memory(dilated_local_attention, inputs, ref.dilated_local_attention,
                  "dilated_local_attention with radius=4, dilation=3, n_global=2, d_k=8, d_v=4")
    _dilated_numpy_only(dilated_local_attention, rng)


CAUSAL_HINT = ("phi(x) = elu(x) + 1 elementwise; output_t = phi(q_t) @ S_t / (phi(q_t) · z_t), where S_t and z_t sum "
               "phi(k_j) v_j^T and phi(k_j) over j <= t only (token t included); leading axes are batch axes, and "
               "the last chunk may be shorter than the others.")


def _causal_numpy_only(causal_linear_attention, rng):
    q, k, v = rng.normal(size=(2, 9, 3)), rng.normal(size=(2, 9, 3)), rng.normal(size=(2, 9, 2))
    numpy_only(causal_linear_attention, q, k, v, 4, what="causal_linear_attention for q of shape (2, 9, 3), chunk=4")


def check_causal_linear_output(causal_linear_attention):
    rng = _rng(4)
    for batch, n, d_k, d_v, chunk, scale in [((), 1, 3, 2, 1, 1.0), ((), 4, 1, 1, 2, 1.0), ((), 17, 8, 5, 4, 1.0),
                                             ((3,), 10, 4, 3, 3, 2.0), ((2, 2), 9, 6, 6, 9, 0.1),
                                             ((2,), 6, 3, 2, 50, 1.0), ((), 23, 4, 4, 1, 1.0),
                                             ((4,), 33, 5, 2, 8, 1.0)]:
        q, k, v = (rng.normal(scale=scale, size=batch + (n, d_k)), rng.normal(scale=scale, size=batch + (n, d_k)),
                   rng.normal(size=batch + (n, d_v)))
        _check_output(causal_linear_attention, (q, k, v, chunk), ref.causal_linear_attention(q, k, v, chunk),
                      f"causal_linear_attention for q of shape {q.shape}, v of shape {v.shape}, chunk={chunk}",
                      CAUSAL_HINT)
    _causal_numpy_only(causal_linear_attention, rng)


def check_causal_linear_extreme(causal_linear_attention):
    """Entries from -15 to 1000: elu(x) + 1 stays positive, so nothing divides by 0.
    (Below about -15, elu(x) + 1 computed as expm1(x) + 1 loses digits, so
    equally correct implementations would disagree.)"""
    rng = _rng(5)
    cases = {
        "strongly negative queries and keys (phi near e^-15)": (-rng.uniform(10, 15, size=(2, 12, 4)),
                                                               -rng.uniform(10, 15, size=(2, 12, 4))),
        "large positive queries and keys": (rng.uniform(100, 1000, size=(2, 12, 4)),
                                            rng.uniform(100, 1000, size=(2, 12, 4))),
        "mixed signs and sizes": (rng.normal(scale=10, size=(2, 12, 4)), rng.normal(scale=10, size=(2, 12, 4))),
    }
    for label, (q, k) in cases.items():
        v = rng.normal(size=(2, 12, 3))
        _check_output(causal_linear_attention, (q, k, v, 5), ref.causal_linear_attention(q, k, v, 5),
                      f"causal_linear_attention with {label}", CAUSAL_HINT)
    _causal_numpy_only(causal_linear_attention, rng)


def check_causal_linear_memory(causal_linear_attention):
    rng = _rng(6)

    def inputs(n):
        return rng.normal(size=(2, n, 8)), rng.normal(size=(2, n, 8)), rng.normal(size=(2, n, 4)), 64

    _check_memory(causal_linear_attention, inputs, ref.causal_linear_attention,
                  "causal_linear_attention with 2 sequences, d_k=8, d_v=4, chunk=64")
    _causal_numpy_only(causal_linear_attention, rng)


def check_causal_linear_chunked(causal_linear_attention):
    """The chunk is used: the tokens of a chunk meet in a chunk x chunk causal
    block, so the peak memory grows with the chunk. Token by token (the
    chapter's recurrence, or running sums) or as one n x n matrix, it does not."""
    rng = _rng(7)
    n, small, large = 2048, 8, 1024
    q, k, v = rng.normal(size=(n, 8)), rng.normal(size=(n, 8)), rng.normal(size=(n, 4))
    peaks = {}
    for chunk in (small, large):
        what = f"causal_linear_attention for n={n} with chunk={chunk}"
        found, peaks[chunk] = traced_peak(call, causal_linear_attention, q, k, v, chunk, what=what)
        expect_close(found, ref.causal_linear_attention(q, k, v, chunk), what=what, hint=CAUSAL_HINT)
    block = large * large * 8  # one float64 block of a chunk's size
    if peaks[large] - peaks[small] < block // 4:
        raise GradingFailure(
            f"causal_linear_attention for n={n}: the peak memory was {peaks[small] / 2**20:.2f} MiB with "
            f"chunk={small} and {peaks[large] / 2**20:.2f} MiB with chunk={large}, so no {large} x {large} causal "
            f"block ({block / 2**20:.0f} MiB) was ever built. Process the tokens chunk by chunk as the exercise asks: "
            "within a chunk through a causal block of the chunk's size, and through the carried state (S, z) for the "
            "earlier chunks; not one token at a time, and not as one n x n matrix.")
    _causal_numpy_only(causal_linear_attention, rng)
