"""Hidden checks for Chapter 4 (FlashAttention): merging softmax states, the
backward pass in NumPy and in Triton, its HBM traffic, and split-K decoding.

The NumPy exercises are compared with autograde.reference.flash over fixed
corners and many seeded random draws. The Triton launchers are graded for
output, memory and for being kernels: every call runs in the student's process
under coursekit.kernel_replay.watch_launcher (kernel launches, and under the
interpreter the bytes each kernel loads and stores; the PyTorch operators of
the host), and the grader applies the rules to that report. Under the
interpreter one call per check is also recorded and replayed with the keys and
values multiplied by secret random signs, sent only after the launcher has
returned: the results of the replay must follow the signs, which results
computed on the host cannot (see coursekit.kernel_replay). Expected answers are
computed from private float64 copies before the student is called."""

import secrets

import numpy as np

from autograde import bounds
from autograde.compare import (GradingFailure, call, call_unchanged, describe, expect_close, expect_int,
                               expect_sequence, expect_within)
from autograde.kernel_compile import TARGETS as COMPILE_TARGETS
from autograde.kernel_compile import compile_kernels
from autograde.memory import GRANULARITY_BYTES, traced_peak, traced_peaks
from autograde.reference import flash as ref
from autograde.sandbox import changed_in_place, in_student_process, note_sighting
from coursekit.kernel_replay import flip_signs
from coursekit.triton_trace import interpreting
from student_runtime import probes

RNG_SEED = 20264


def _rng(offset=0):
    return np.random.default_rng(RNG_SEED + offset)


# ------------------------------------------------------------- merging partial softmax states

MERGE_HINT = ("Carry every chunk's sum to the common max before adding: weight_c = l_c * exp(m_c - m), "
              "l = sum_c weight_c and o = sum_c weight_c * o_c / l. A chunk with m_c = -inf contributes nothing, "
              "and a row whose chunks are all empty has m = -inf, l = 0 and o = 0 (no nan).")


def chunk_states(scores, v, bounds):
    """The (m, l, o) of each key chunk [a, b) of rows of scores (..., n) over values v (..., n, d_v),
    stacked on a new first axis: what a split-K pass stores per chunk. An empty range is an empty chunk."""
    ms, ls, os_ = [], [], []
    for a, b in bounds:
        part = scores[..., a:b]
        m = part.max(axis=-1) if b > a else np.full(scores.shape[:-1], -np.inf)
        safe = np.where(np.isneginf(m), 0.0, m)
        e = np.exp(part - safe[..., None])
        l = e.sum(axis=-1)
        o = np.einsum("...j,...jd->...d", e, v[..., a:b, :])
        ms.append(m)
        ls.append(l)
        os_.append(np.divide(o, l[..., None], out=np.zeros_like(o), where=l[..., None] > 0))
    return np.stack(ms), np.stack(ls), np.stack(os_)


def _merge_bounds(m, o, m_all, l_all, o_all):
    """Rounding-error bounds for a merge in float64 (unit 2^-53) by any correct route:
    weights exp(m_c - m) computed directly or through logarithms (log-sum-exp, logaddexp),
    whose arguments round by up to |m| units, then sums over the C chunks. l's relative
    error is then below (8 (C + 4) + 4 |m|) units of the row, o's as much relative to
    the chunks' largest output (o is their weighted mean); m is a maximum, exact up to a
    round trip through such a sum."""
    unit = 2.0 ** -53
    chunks = m.shape[0]
    finite = np.where(np.isfinite(m), np.abs(m), 0.0).max(axis=0)
    relative = (8 * (chunks + 4) + 4 * finite) * unit
    largest = np.abs(o).max(axis=(0, -1))
    return {"m": 4 * unit * np.abs(np.where(np.isfinite(m_all), m_all, 0.0)),
            "l": relative * np.abs(l_all),
            "o": (2 * relative * largest)[..., None] + 0 * o_all}


def _check_merge(fn, scores, v, bounds):
    m, l, o = chunk_states(scores, v, bounds)
    what = f"merge_softmax_states(m {m.shape}, l {l.shape}, o {o.shape}) for key chunks {bounds}"
    expected = ref.merge_softmax_states(m, l, o)
    merge_bound = _merge_bounds(m, o, *expected)
    found = call_unchanged(fn, m, l, o, what=what)
    expect_sequence(found, 3, what=what, names="(m, l, o)")
    for name, value, want in zip("mlo", found, expected):
        label = f"{what}: {name}"
        value = np.asarray(value) if isinstance(value, (float, np.floating)) else value
        if not isinstance(value, np.ndarray) or value.shape != want.shape:
            raise GradingFailure(f"{label} should be an array of shape {want.shape}, but is {describe(value)}.")
        empty = np.isneginf(want)
        if not np.array_equal(np.isneginf(value), empty):
            row = tuple(int(i) for i in np.argwhere(np.isneginf(value) != empty)[0])
            raise GradingFailure(f"{label} at {row}: expected {want[row]}, found {value[row]}. {MERGE_HINT}")
        expect_within(np.where(empty, 0.0, value), np.where(empty, 0.0, want), merge_bound[name], what=label,
                      hint=MERGE_HINT)


def _random_bounds(rng, n, chunks):
    """`chunks` ranges covering 0..n in a random order, some of them possibly empty."""
    cuts = np.sort(rng.integers(0, n + 1, size=chunks - 1))
    edges = [0, *cuts.tolist(), n]
    bounds = [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
    return [bounds[i] for i in rng.permutation(len(bounds))]


def check_merge_values(merge_softmax_states):
    """Two to six chunks of unequal sizes (one, or empty, chunks included) in any order; one row,
    a batch of rows, two leading axes; d_v from 1 to 5; fixed cases, then 24 seeded draws."""
    rng = _rng(11)
    for lead, n, d_v, bounds in [((), 6, 3, [(0, 3), (3, 6)]), ((4,), 10, 2, [(0, 4), (4, 7), (7, 10)]),
                                 ((2, 3), 9, 5, [(0, 1), (1, 2), (2, 8), (8, 9)]), ((5,), 12, 1, [(0, 12)]),
                                 ((3,), 11, 4, [(6, 11), (0, 2), (2, 6)]), ((2,), 15, 3, [(0, 3)] + [(a, a + 3) for a in range(3, 15, 3)])]:
        scores = rng.normal(scale=2.0, size=lead + (n,))
        _check_merge(merge_softmax_states, scores, rng.normal(size=lead + (n, d_v)), bounds)
    for _ in range(24):
        lead = tuple(int(x) for x in rng.integers(1, 4, size=rng.integers(0, 3)))
        n, d_v = int(rng.integers(1, 30)), int(rng.integers(1, 6))
        scores = rng.normal(scale=rng.choice([0.5, 2.0, 8.0]), size=lead + (n,))
        bounds = _random_bounds(rng, n, int(rng.integers(1, 7)))
        _check_merge(merge_softmax_states, scores, rng.normal(size=lead + (n, d_v)), bounds)


def check_merge_extreme(merge_softmax_states):
    """Scores near ±1e3 (exp(m) overflows), empty chunks (m = -inf, l = 0), a row whose
    chunks are all empty, and a chunk whose max is far below the others (its weight underflows
    to 0); then seeded draws whose rows sit at very different offsets (near 0 and near ±1e6 in
    one call), with masked keys."""
    rng = _rng(12)
    scores = rng.normal(size=(6, 12))
    scores[0] *= 1e3
    scores[1] = scores[1] - 1e3
    scores[2, :8] = -np.inf                 # the first two chunks see only masked keys
    scores[3] = -np.inf                     # nothing to attend to
    scores[4, 4:] -= 900.0                  # later chunks are negligible
    scores[5, ::2] = -np.inf
    v = rng.normal(size=(6, 12, 3))
    for bounds in ([(0, 4), (4, 8), (8, 12)], [(0, 1), (1, 12)], [(8, 12), (0, 8)]):
        _check_merge(merge_softmax_states, scores, v, bounds)
    for _ in range(12):
        rows, n = int(rng.integers(2, 6)), int(rng.integers(2, 20))
        offsets = rng.choice([0.0, 1e6, -1e6, 700.0, -750.0], size=(rows, 1))
        scores = offsets + rng.normal(scale=rng.choice([1.0, 50.0]), size=(rows, n))
        scores[rng.random(size=scores.shape) < 0.3] = -np.inf
        scores[rng.integers(rows)] = -np.inf
        _check_merge(merge_softmax_states, scores, rng.normal(size=(rows, n, 2)),
                     _random_bounds(rng, n, int(rng.integers(2, 6))))


# ------------------------------------------------------------- the backward pass in NumPy

TILED_BWD_HINT = ("Recompute each tile of P as exp(S * scale - lse) (no running max is needed: lse is final), "
                  "then dV += P^T dO, dP = dO V^T, dS = P * (dP - D) with D = rowsum(dO * O) over the whole row, "
                  "dQ += dS K * scale and dK += dS^T Q * scale. Scores are scaled by 1/sqrt(d); causal: key j <= query i.")


def _check_tiled_bwd(fn, q, k, v, do, block_m, block_n, causal):
    o, lse = ref.attention_with_lse(q, k, v, causal)
    expected = ref.attention_backward(q, k, v, do, causal)
    what = (f"tiled_attention_backward(q {q.shape}, k {k.shape}, v {v.shape}, ..., block_m={block_m}, "
            f"block_n={block_n}, causal={causal})")
    found = call_unchanged(fn, q, k, v, o, do, lse, block_m, block_n, causal=causal, what=what)
    expect_sequence(found, 3, what=what, names="(dq, dk, dv)")
    # float64 throughout: P recomputed from lse at scores of several hundred is off by about
    # |s| 2^-53 < 1e-13 relative, sums of a few hundred terms add n 2^-53; 1e-8 is far above both
    for name, value, want in zip(("dq", "dk", "dv"), found, expected):
        expect_close(value, want, what=f"{what}: {name}", rtol=1e-8, atol=1e-10, hint=TILED_BWD_HINT)


def _tiled_draw(rng, causal):
    """Seeded random shapes: zero to two batch axes, ragged sizes, blocks that divide n or not."""
    batch = tuple(int(x) for x in rng.integers(1, 4, size=rng.integers(0, 3)))
    n_q = int(rng.integers(1, 70))
    n_k = n_q if causal else int(rng.integers(1, 70))
    d, d_v = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    block_m, block_n = (int(rng.choice([1, 2, 3, 5, 8, 16, 64])) for _ in range(2))
    return batch, n_q, n_k, d, d_v, block_m, block_n


def check_tiled_bwd_output(tiled_attention_backward):
    """Non-causal: blocks that divide n, that do not, larger than n, of size 1; fewer or
    more keys than queries; d_v != d; one and two leading batch axes; then 16 seeded draws."""
    rng = _rng(13)
    cases = [((), 8, 8, 4, 4, 4, 4), ((), 10, 10, 3, 3, 3, 4), ((), 1, 1, 2, 2, 1, 3), ((), 7, 7, 5, 3, 32, 32),
             ((), 5, 13, 4, 2, 2, 4), ((), 12, 3, 3, 6, 4, 2), ((2,), 9, 9, 4, 3, 4, 3), ((2, 3), 6, 11, 2, 3, 4, 5)]
    for batch, n_q, n_k, d, d_v, block_m, block_n in cases + [_tiled_draw(rng, False) for _ in range(16)]:
        q, k = rng.normal(size=batch + (n_q, d)), rng.normal(size=batch + (n_k, d))
        v, do = rng.normal(size=batch + (n_k, d_v)), rng.normal(size=batch + (n_q, d_v))
        _check_tiled_bwd(tiled_attention_backward, q, k, v, do, block_m, block_n, False)


def check_tiled_bwd_causal(tiled_attention_backward):
    """Causal: query i sees keys 0..i, with blocks of unequal sizes, ragged n from 1 to about
    130, d_v != d and batch axes; then 16 seeded draws."""
    rng = _rng(14)
    cases = [((), 1, 3, 3, 4, 4), ((), 8, 4, 4, 4, 4), ((), 10, 4, 4, 3, 4), ((), 10, 4, 4, 4, 3),
             ((), 17, 5, 5, 16, 2), ((3,), 9, 2, 2, 2, 5), ((2, 2), 7, 3, 3, 7, 1), ((), 64, 8, 3, 16, 16),
             ((2,), 100, 4, 6, 32, 7), ((), 129, 3, 3, 64, 33), ((), 96, 2, 2, 5, 64)]
    for batch, n, d, d_v, block_m, block_n in cases:
        q, k, do = rng.normal(size=batch + (n, d)), rng.normal(size=batch + (n, d)), rng.normal(size=batch + (n, d_v))
        _check_tiled_bwd(tiled_attention_backward, q, k, rng.normal(size=batch + (n, d_v)), do, block_m, block_n, True)
    for _ in range(16):
        batch, n, _, d, d_v, block_m, block_n = _tiled_draw(rng, True)
        q, k, do = rng.normal(size=batch + (n, d)), rng.normal(size=batch + (n, d)), rng.normal(size=batch + (n, d_v))
        _check_tiled_bwd(tiled_attention_backward, q, k, rng.normal(size=batch + (n, d_v)), do, block_m, block_n, True)


def check_tiled_bwd_extreme(tiled_attention_backward):
    """Scores of size several hundred (exp(S) overflows unless P is recomputed as exp(S - lse)),
    causal and not, with batch axes, and rows whose scores sit hundreds apart."""
    rng = _rng(15)
    for scale in (10.0, 40.0):
        q, k = rng.normal(scale=scale, size=(12, 4)), rng.normal(scale=scale, size=(12, 4))
        v, do = rng.normal(size=(12, 3)), rng.normal(size=(12, 3))
        _check_tiled_bwd(tiled_attention_backward, q, k, v, do, 4, 3, False)
        _check_tiled_bwd(tiled_attention_backward, q, k, v, do, 5, 2, True)
    for seed in range(6):
        batch, n, d = (2,), int(rng.integers(5, 40)), int(rng.integers(2, 6))
        q = rng.normal(scale=rng.choice([15.0, 30.0]), size=batch + (n, d))
        q[..., ::3, :] *= 0.01                    # rows of small scores beside rows in the hundreds
        k, v, do = rng.normal(size=batch + (n, d)) * 3, rng.normal(size=batch + (n, 3)), rng.normal(size=batch + (n, 3))
        _check_tiled_bwd(tiled_attention_backward, q, k, v, do, 3 + seed, 4, bool(seed % 2))


def tiled_bwd_memory_budget(n, d, block_m, block_n):
    """What a tiled backward may hold at once, in bytes: the three float64 gradients, and half
    of one strip of P along the longer side of a tile (max(block_m, block_n) x n float64). The
    check's tiles are long and thin, a 128th of a strip or less: a dozen of them, copies of the
    inputs and what the kernel's count adds to a call (autograde.memory.GRANULARITY_BYTES) fit
    in that half with room to spare, and a strip, an n x n matrix or mask does not."""
    return 8 * 3 * n * d + 8 * max(block_m, block_n) * n // 2


# The memory check's sizes. Its tiles are long and thin, 512 x 16 and 16 x 512 (64 KiB), so a strip
# of P along the long side (8 MiB at n = 2048, 16 MiB at n = 4096) shows whichever loop is outermost;
# causal at n = 4096, where a mask for the whole matrix (16 MiB of booleans) shows too.
TILED_MEMORY_D = 4
TILED_MEMORY_CASES = ((2048, False), (4096, True))
TILED_MEMORY_TILES = ((512, 16), (16, 512))


def check_tiled_bwd_memory(tiled_attention_backward):
    """Peak memory with d = 4 and tiles of 512 x 16 and of 16 x 512, at n = 2048 and at n = 4096
    causal, must stay within tiled_bwd_memory_budget (4.2 and 8.4 MiB): a correct backward holds
    under 1 MiB in any loop order; a strip of P along the tiles' long side (8 and 16 MiB), an
    n x n matrix (32 and 128 MiB) or a causal mask for the whole matrix (16 MiB of booleans)
    does not fit."""
    rng = _rng(16)
    for n, causal in TILED_MEMORY_CASES:
        q, k, v, do = (rng.normal(size=(n, TILED_MEMORY_D)) for _ in range(4))
        o, lse = ref.attention_with_lse(q, k, v, causal)
        expected = ref.attention_backward(q, k, v, do, causal, o=o, lse=lse)
        for block_m, block_n in TILED_MEMORY_TILES:
            _check_tiled_peak(tiled_attention_backward, (q, k, v, o, do, lse), expected, block_m, block_n, causal)


def _check_tiled_peak(fn, inputs, expected, block_m, block_n, causal):
    n, d = inputs[0].shape
    what = f"tiled_attention_backward for n={n}, d={d}, block_m={block_m}, block_n={block_n}, causal={causal}"
    found, peak = traced_peak(call, fn, *inputs, block_m, block_n, causal, what=what)
    expect_sequence(found, 3, what=what, names="(dq, dk, dv)")
    for name, value, want in zip(("dq", "dk", "dv"), found, expected):
        expect_close(value, want, what=f"{what}: {name}", rtol=1e-8, atol=1e-10, hint=TILED_BWD_HINT)
    budget = tiled_bwd_memory_budget(n, d, block_m, block_n)
    if peak > budget:
        strip = f"{block_m} x {n} (a strip of P for one block of queries)" if block_m > block_n else \
            f"{n} x {block_n} (a strip of P for one block of keys)"
        raise GradingFailure(
            f"{what}: peak memory was {peak / 2**20:.2f} MiB, more than the {budget / 2**20:.2f} MiB a tiled "
            f"backward needs (a few {block_m} x {block_n} tiles plus the gradients). An array of {strip} or of "
            f"{n} x {n} entries is being built"
            + (" (a causal mask for the whole matrix counts too: build it per tile)" if causal else "")
            + ": recompute P one tile at a time, and keep no more than a tile of it.")


# ------------------------------------------------------------- the backward pass's traffic

TRAFFIC_HINT = ("D: read O and dO, write D. dK/dV pass: K, V read and dK, dV written once; each of the "
                "ceil(n / block_n) key blocks reads Q, dO, lse and D. dQ pass: Q, dO, lse, D read and dQ "
                "written once; each of the ceil(n / block_m) query blocks reads K and V. Use integer "
                "ceiling division and Python ints: floats lose digits above 2^53, NumPy's int64 wraps "
                "around above 2^63.")


def _traffic_draw(rng):
    """A seeded size within the exercise's range: n up to 10^9, blocks from 1 to n (log-uniform)."""
    n = int(np.exp(rng.uniform(0, np.log(1e9))))
    d = int(rng.integers(1, 257))
    block_m, block_n = (max(1, int(np.exp(rng.uniform(0, np.log(n + 1))))) for _ in range(2))
    return n, d, block_m, block_n


def check_traffic_backward(hbm_traffic_backward):
    """Fixed corners (blocks that divide n, do not, exceed it, of size 1), totals above 2^53 whose
    low bits a float loses and above 2^63 where int64 wraps, then 300 seeded sizes up to n = 10^9."""
    rng = _rng(17)
    corners = [(1, 1, 1, 1), (8, 4, 8, 8), (8, 4, 3, 5), (100, 16, 64, 32), (64, 64, 128, 16), (1000, 64, 7, 13),
               (4096, 128, 128, 64), (10**6 + 1, 64, 128, 64), (10**9, 128, 10**5 + 3, 257),
               (999_999_937, 129, 1, 3), (10**9, 256, 1, 1), (987_654_321, 255, 2, 1), (10**9 - 1, 77, 10**9, 1)]
    for n, d, block_m, block_n in corners + [_traffic_draw(rng) for _ in range(300)]:
        what = f"hbm_traffic_backward(n={n}, d={d}, block_m={block_m}, block_n={block_n})"
        expect_int(call(hbm_traffic_backward, n, d, block_m, block_n, what=what),
                   ref.hbm_traffic_backward(n, d, block_m, block_n), what=what, hint=TRAFFIC_HINT)


# ------------------------------------------------------------- launchers graded as Triton kernels

# Operators that compute attention (or its products) in PyTorch instead of a kernel.
FORBIDDEN_OPS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "einsum", "softmax", "_softmax",
                 "log_softmax", "_log_softmax", "scaled_dot_product", "flash_attention", "efficient_attention")

# The replayed inputs (coursekit.kernel_replay): the keys and the values, the second and
# third positional arguments of both launchers.
CHANGED_INPUTS = (1, 2)

# The integrity report's reasons: results that do not follow the kernels' loads, and
# libraries patched under the replay.
FOLLOW_SIGHTING = "results computed outside the Triton kernels"
CHANGED_SIGHTING = "patches the libraries that run the kernels"
COMPILE_SIGHTING = "its kernel's compiling process reported what the compiler did not make"
FOLLOW_HINT = ("The grader ran your launcher's kernels again on keys and values with some signs changed; what "
               "your kernels compute follows such a change, anything computed outside them (on the host, by NumPy "
               "or PyTorch, from the inputs or from a copy a kernel made of them) does not. Compute the results "
               "in your kernels from what they load.")


def _device_and_dtype(dtype):
    import torch

    from coursekit.triton_env import triton_device

    device = triton_device(quiet=True)
    return device, dtype or (torch.float16 if device == "cuda" else torch.float32)


def _nbytes(t):
    return t.numel() * t.element_size()


# Memory layouts of the inputs: the spec allows non-contiguous tensors, so the hidden tests
# pass views of other layouts, with the same values.
def _in_layout(t, layout, gen):
    """t with the same values in another memory layout: "contiguous"; "heads_inner": the
    (B, N, H, D) layout of a projection, seen as (B, H, N, D) (decoding's q, (B, H, D): the
    heads innermost, so that its last axis is not contiguous); "d_major": the last axis not
    contiguous; "sliced": a window of a wider, longer buffer (an offset and padded strides);
    "window": the first positions of a longer buffer, as a preallocated KV cache is;
    "heads_inner_window": the same in the (B, N, H, D) layout (other tensors: "window")."""
    import torch

    if layout == "contiguous":
        return t
    if layout == "heads_inner":    # for decoding's 3-D q, transpose(1, -2) would change nothing
        other = 2 if t.dim() == 3 else -2
        return t.transpose(1, other).contiguous().transpose(1, other)
    if layout == "d_major":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced":
        wide = torch.randn(*t.shape[:-2], t.shape[-2] + 5, 2 * t.shape[-1] + 3, generator=gen).to(t.device, t.dtype)
        view = wide[..., 2:2 + t.shape[-2], 3:3 + t.shape[-1]]
        view.copy_(t)
        return view
    if layout == "window":
        longer = torch.randn(*t.shape[:-2], t.shape[-2] + 64, t.shape[-1], generator=gen).to(t.device, t.dtype)
        view = longer[..., :t.shape[-2], :]
        view.copy_(t)
        return view
    if layout == "heads_inner_window":   # a (B, L, H, D) buffer, longer than L, seen as (B, H, L, D)
        if t.dim() != 4:                 # decoding's q, (B, H, D): a window of a longer buffer
            return _in_layout(t, "window", gen)
        longer = torch.randn(t.shape[0], t.shape[-2] + 64, t.shape[1], t.shape[-1], generator=gen).to(t.device, t.dtype)
        view = longer[:, :t.shape[-2]].transpose(1, 2)
        view.copy_(t)
        return view
    raise ValueError(layout)


def _layouts(layout, names):
    """One layout per tensor: a single layout for all, or one each, in the order of names."""
    layouts = (layout,) * len(names) if isinstance(layout, str) else tuple(layout)
    assert len(layouts) == len(names), (layout, names)
    return layouts


def _layout_words(layout, names):
    """The layout in a failure message: '' for contiguous tensors."""
    layouts = _layouts(layout, names)
    if set(layouts) == {"contiguous"}:
        return ""
    if len(set(layouts)) == 1:
        return f", non-contiguous inputs ({layouts[0].replace('_', ' ')})"
    return ", inputs in different layouts (" + ", ".join(
        f"{name} {kind.replace('_', ' ')}" for name, kind in zip(names, layouts)) + ")"


def _forbidden(names):
    return sorted({name for name in names
                   if name in FORBIDDEN_OPS or "scaled_dot_product" in name or "attention" in name})


def _launch(launcher, args, kwargs, what, *, record=False):
    """(result, report, recording): the student's launcher called under the kernel trace
    in the student's process (student_runtime.probes.traced_launcher_call)."""
    return in_student_process(probes.traced_launcher_call, launcher, list(args), dict(kwargs), what, record)


def _judge_kernels(what, report, *, stored_at_least, loaded_at_least):
    """The rules for a launcher graded as Triton kernels, applied to what the call did: no
    attention or matrix product in PyTorch, kernels of its own launched, no plain stores of
    one address by several programs, and (interpreter) the results' bytes stored by kernels."""
    used = _forbidden(report["ops"])
    if used:
        raise GradingFailure(f"{what} used PyTorch's {', '.join(used)}: the computation must be done by your Triton "
                             "kernels; the launcher may only allocate buffers and launch them.")
    if report["launches"] == 0:
        raise GradingFailure(f"{what} launched no Triton kernel: call your @triton.jit kernels as kernel[grid](...).")
    borrowed = [m for m in report["modules"] if m.split(".")[0] in ("bookutils", "coursekit")]
    if borrowed:
        raise GradingFailure(f"{what} launched kernels of the book's modules ({', '.join(borrowed)}): the exercise "
                             "asks for kernels you write; define them with @triton.jit in your notebook.")
    if not report["interpreting"]:
        return
    if report["shared_stores"]:
        name, count = next(iter(report["shared_stores"].items()))
        raise GradingFailure(
            f"{what}: in one launch of {name}, {count} addresses were written with tl.store by more than one "
            "program. On a GPU the programs of a launch run at the same time, so such writes (and a "
            "tl.load followed by tl.store of a sum) lose each other's updates. Give every program its own "
            "outputs, or add into shared ones with tl.atomic_add.")
    if report["bytes_stored"] < stored_at_least or report["bytes_loaded"] < loaded_at_least:
        raise GradingFailure(
            f"{what}: the Triton kernels loaded {report['bytes_loaded']} bytes and stored {report['bytes_stored']}, "
            f"but reading the inputs needs at least {loaded_at_least} and writing the results {stored_at_least}: "
            "the results must be computed and stored by your kernels (tl.load, tl.store), not by PyTorch.")


def _expect_inputs_unchanged(what, names, originals, inputs, advice):
    import torch

    for name, before, after in zip(names, originals, inputs):
        if changed_in_place(after) or not torch.equal(before, after):
            raise GradingFailure(f"{what} changed its input {name}; {advice}")


def _native():
    """Whether kernels run natively on a GPU (float32 products in TF32 unless a kernel asks
    for IEEE float32: autograde.bounds), not in the interpreter."""
    return _device_and_dtype(None)[0] == "cuda"


def _expect_tensor_close(what, value, want, bound, like, dtype, hint):
    """A student tensor against a float64 reference, within the element-wise rounding-error
    bound of the computation (autograde.bounds): type, shape, dtype, device, then values.
    Values that are right up to some column of the last axis and wrong after it (a block over
    the head dimension that stops short) are named as such."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise GradingFailure(f"{what} should be a torch.Tensor, but is {describe(value)}.")
    if tuple(value.shape) != tuple(like.shape) or value.dtype != dtype or value.device != like.device:
        raise GradingFailure(f"{what} should be a {dtype} tensor of shape {tuple(like.shape)} on {like.device}, "
                             f"but is {value.dtype} of shape {tuple(value.shape)} on {value.device}.")
    found = value.detach().double().cpu().numpy()
    close = np.abs(found - want) <= bound
    columns = close.reshape(-1, close.shape[-1]).all(axis=0)
    if not columns.all() and columns.any():
        first_bad = int(np.argmin(columns))
        if columns[:first_bad].all() and not columns[first_bad:].any():
            raise GradingFailure(
                f"{what}: columns {first_bad} to {close.shape[-1] - 1} of the last axis (the head dimension, "
                f"D = {close.shape[-1]}) are wrong, columns 0 to {first_bad - 1} are right. Does a block over the "
                f"head dimension stop at {first_bad}? It must cover all of D, e.g. "
                "BLOCK_D = max(16, triton.next_power_of_2(D)) with a mask for the columns past D.")
    expect_within(found, want, bound, what=what, hint=hint)


def _compare_outputs(what, report, results_bytes, head_dim, comparisons):
    """Run the comparisons (callables raising GradingFailure). When one fails and the
    kernels stored fewer bytes than the results hold, the message says so: part of the
    results was never written, most often because a block over the head dimension is
    smaller than D."""
    try:
        for compare in comparisons:
            compare()
    except GradingFailure as failure:
        stored = report["bytes_stored"]
        if report["interpreting"] and stored < results_bytes:
            raise GradingFailure(
                f"{failure} Your kernels stored {stored} bytes, less than the {results_bytes} bytes of the results: "
                f"some of them were never written. With D = {head_dim}, does a block over the head dimension "
                "(BLOCK_D) cover all of D? Use max(16, triton.next_power_of_2(D)) with a mask for the columns "
                "past D.") from None
        raise


def _replay(launcher, recording):
    """(seed, replayed results) of a recorded call, with the keys and values multiplied by
    signs drawn from a fresh secret seed, sent to the student's process only now."""
    seed = secrets.randbits(63)
    return seed, in_student_process(probes.replayed_launcher_call, recording, seed, list(CHANGED_INPUTS))


def _judge_follow(launcher, what, names, replayed, expected, accepted, budget):
    """The verdict on a replayed call (coursekit.kernel_replay): its results must equal one
    of the `accepted` answers for the changed keys and values, with at most `budget`
    elements of PyTorch arithmetic on the host over data that depends on them. Results that
    equal the answer for the real inputs were computed outside the kernels: reported for a
    person to look at. Other wrong ones hold only for some inputs. `expected` and each
    accepted answer are (results, their error bounds)."""
    if replayed["changed"]:
        names = ", ".join(replayed["changed"][:5])
        note_sighting(launcher, CHANGED_SIGHTING, f"{what}: rebound {names}")
        raise GradingFailure(f"{what}: the notebook rebound {names}, which the grader's check of your kernels runs "
                             "through, so it cannot run them again. Do not patch Triton, NumPy or PyTorch.")
    if replayed["host_work"] > budget:
        ops = ", ".join(replayed["host_ops"])
        note_sighting(launcher, FOLLOW_SIGHTING, f"{what}: {replayed['host_work']} elements of host arithmetic "
                                                 f"({ops}) on values from the kernels")
        raise GradingFailure(
            f"{what}: the launcher's PyTorch code computed on {replayed['host_work']} elements of values that come "
            f"from the keys and values ({ops}), more than the {budget} a merge of partial results or a cast "
            "needs: the attention must be computed by your kernels, not by PyTorch on the host.")
    outputs = replayed["outputs"]
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    found = [o.detach().double().cpu().numpy() if hasattr(o, "detach") else None for o in outputs]
    if len(found) != len(names):
        found = (found + [None] * len(names))[:len(names)]

    def close(value, want, bound):
        return value is not None and value.shape == want.shape and bool(np.all(np.abs(value - want) <= bound))

    if any(all(close(f, w, b) for f, w, b in zip(found, *answer)) for answer in accepted):
        return
    unchanged = [name for name, f, w, b in zip(names, found, *expected) if close(f, w, b)]
    if unchanged:
        note_sighting(launcher, FOLLOW_SIGHTING, f"{what}: {', '.join(unchanged)} did not follow")
        raise GradingFailure(f"{what}: {', '.join(unchanged)} did not follow the keys and values your kernels "
                             f"loaded. {FOLLOW_HINT}")
    raise GradingFailure(f"{what}: right for these inputs, but wrong once the grader ran your kernels again on keys "
                         "and values with some signs changed: a formula that only holds for some inputs.")


def _check_compiles(launcher, calls, what, computes):
    """The kernels `launcher` starts for `calls` (the hidden tests' calls, in the dtype a
    GPU gets) must compile for COMPILE_TARGETS, not only run in the interpreter: one
    launch per kernel, compiled in a jail (autograde.kernel_compile). What the compiler
    makes of them (registers, spills, occupancy) is printed as advice. The point goes only
    to kernels that produce the function's results: `computes()` first runs the output
    check on these very calls (_computes_what_it_compiles)."""
    _computes_what_it_compiles(what, computes)
    kernels = in_student_process(probes.launched_kernels, launcher, calls, what)
    if not kernels:
        raise GradingFailure(f"{what} launched no Triton kernel: call your @triton.jit kernels as kernel[grid](...).")
    advice = []
    for kernel, targets in zip(kernels, compile_kernels(launcher, kernels)):
        for target in targets:
            if target.compiles is None:
                advice.append(f"{kernel['kernel']}: {target.problem()}")
            elif not target.compiles:
                if target.refused():
                    note_sighting(launcher, COMPILE_SIGHTING, f"{kernel['kernel']} on {target.target}: {target.error}")
                    raise GradingFailure(f"{what}: the process that compiled its kernel {kernel['kernel']} for an "
                                         f"{target.target} reported a kernel the compiler did not make ({target.error}).")
                where = target.where
                at = f" (in {where['function']}, line {where['line']} of its cell: {where['text']})" if where else ""
                message = where["message"] if where else (target.error or "").strip().splitlines()[-1]
                raise GradingFailure(
                    f"{what}: its kernel {kernel['kernel']} runs in Triton's interpreter but does not compile for an "
                    f"{target.target} "
                    f"({target.arch}){at}: {message}. Inside @triton.jit, use tl operations, other @triton.jit "
                    "functions and constexpr values only: NumPy, math on tensors or a plain Python function run in "
                    "the interpreter, which executes kernels with NumPy, but not on a GPU.")
            else:
                advice.append(f"{kernel['kernel']} [{kernel['label']}] on {target.summary()}")
    print(f"What {' and '.join(COMPILE_TARGETS)} make of your kernels (advice, not points):\n  " + "\n  ".join(advice))


def _computes_what_it_compiles(what, computes):
    """`computes()`: the output cells' check of the launcher (results against the float64
    reference, computed in the interpreter or on the GPU, and the rules for kernels) on the
    inputs that are compiled. Kernels that store zeros, or only part of the results, compile
    as well as any: without this, they would earn the point."""
    try:
        computes()
    except GradingFailure as failure:
        raise GradingFailure(f"{what}: kernels that compile earn this point only if they compute the function's "
                             f"results, and on the calls compiled here they do not. {failure}") from None


# ------------------------------------------------------------- the backward kernels in Triton

BWD_HINT = ("Check D = rowsum(dO * O), P = exp(sm_scale * QK^T - lse) with the masks for the ragged last block and "
            "the causal condition (key j <= query i), dS = P * (dP - D), the factor sm_scale in dQ and dK, and, "
            "when k and v have fewer heads than q, that dK and dV add up every query head of the group. Inputs "
            "may be non-contiguous: use their strides in the kernels, or .contiguous() copies in the launcher.")


BWD_INPUTS = ("q", "k", "v", "o", "do")         # the tensors a layout is given for, in this order
DECODE_INPUTS = ("q", "k_cache", "v_cache")


def _bwd_inputs(shape, causal, sm_scale, *, seed, dtype, magnitude, layout):
    """(q, k, v, o, lse, do) as the launcher gets them, in float64 NumPy, and the
    float64 o and lse of exact attention."""
    import torch

    device, dtype = _device_and_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, n, d = shape
    q = (magnitude * torch.randn(batch, heads, n, d, generator=gen)).to(dtype)
    k = (magnitude * torch.randn(batch, kv_heads, n, d, generator=gen)).to(dtype)
    v, do = torch.randn(batch, kv_heads, n, d, generator=gen).to(dtype), torch.randn(batch, heads, n, d, generator=gen).to(dtype)
    q64, k64, v64, do64 = (t.double().numpy() for t in (q, k, v, do))
    group = heads // kv_heads
    o64, lse64 = ref.attention_with_lse(q64, np.repeat(k64, group, 1), np.repeat(v64, group, 1), causal, sm_scale)
    o = torch.from_numpy(o64).to(dtype=dtype)
    lse = torch.from_numpy(lse64).to(device=device, dtype=torch.float32)
    layouts = _layouts(layout, BWD_INPUTS)
    if set(layouts) != {"contiguous"}:      # lse, a (B, H, N) tensor, is then a strided window too
        lse = _in_layout(lse[..., None], "sliced", gen)[..., 0]
    q, k, v, o, do = (_in_layout(t.to(device), kind, gen) for t, kind in zip((q, k, v, o, do), layouts))
    return (q, k, v, o, lse, do), (q64, k64, v64, do64, o64, lse64), dtype


def bwd_answer(q64, k64, v64, do64, causal, sm_scale, dtype, o=None, lse=None):
    """((dq, dk, dv), their error bounds) for kernels handed these keys and values, o and lse:
    o and lse of exact attention over them where not given (autograde.bounds)."""
    if o is None or lse is None:
        group = q64.shape[1] // k64.shape[1]
        o_exact, lse_exact = ref.attention_with_lse(q64, np.repeat(k64, group, 1), np.repeat(v64, group, 1), causal,
                                                    sm_scale)
        o, lse = (o_exact if o is None else o), (lse_exact if lse is None else lse)
    return (ref.attention_backward(q64, k64, v64, do64, causal, sm_scale, o=o, lse=lse),
            bounds.backward_bounds(q64, k64, v64, do64, o, lse, causal, sm_scale, dtype, _native()))


def _bwd_accepted(q64, k64, v64, do64, o64, lse64, causal, sm_scale, dtype, signs_k, signs_v):
    """The answers a replay with the keys and values multiplied by these signs may give: P
    from the given log-sum-exp, from one the kernels recompute over the keys they load, or
    with O recomputed as well."""
    k2, v2 = k64 * signs_k, v64 * signs_v
    return [bwd_answer(q64, k2, v2, do64, causal, sm_scale, dtype, o=o64, lse=lse64),
            bwd_answer(q64, k2, v2, do64, causal, sm_scale, dtype, o=o64),
            bwd_answer(q64, k2, v2, do64, causal, sm_scale, dtype)]


def bwd_products(shape):
    """Multiply-adds of Q K^T for one backward call: B * H * N * N * D."""
    batch, heads, _, n, d = shape
    return batch * heads * n * n * d


def _check_bwd(flash_attention_backward, shape, causal=False, sm_scale=None, *, seed, dtype=None, magnitude=1.0,
               follow=False, layout="contiguous"):
    import torch

    (q, k, v, o, lse, do), (q64, k64, v64, do64, o64, lse64), dtype = _bwd_inputs(
        shape, causal, sm_scale, seed=seed, dtype=dtype, magnitude=magnitude, layout=layout)
    expected = bwd_answer(q64, k64, v64, do64, causal, sm_scale, dtype, o=o64, lse=lse64)
    originals = [t.clone() for t in (q, k, v, o, lse, do)]
    what = (f"flash_attention_backward(q of shape {tuple(q.shape)}, k and v of shape {tuple(k.shape)}, {dtype}, "
            f"causal={causal}" + (f", sm_scale={sm_scale}" if sm_scale is not None else "")
            + _layout_words(layout, BWD_INPUTS) + ")")
    kwargs = {"causal": causal} if sm_scale is None else {"causal": causal, "sm_scale": sm_scale}
    follow = follow and interpreting() and dtype == torch.float32
    found, report, recording = _launch(flash_attention_backward, (q, k, v, o, lse, do), kwargs, what, record=follow)
    expect_sequence(found, 3, what=what, names="(dq, dk, dv)")
    _expect_inputs_unchanged(what, ("q", "k", "v", "o", "lse", "do"), originals, (q, k, v, o, lse, do),
                             "write only to the gradients.")
    results_bytes = _nbytes(q) + _nbytes(k) + _nbytes(v)
    _compare_outputs(what, report, results_bytes, q.shape[-1], [
        lambda name=name, value=value, want=want, bound=bound, like=like: _expect_tensor_close(
            f"{what}: {name}", value, want, bound, like, dtype, BWD_HINT)
        for name, value, want, bound, like in zip(("dq", "dk", "dv"), found, *expected, (q, k, v))])
    _judge_kernels(what, report, stored_at_least=results_bytes, loaded_at_least=_nbytes(q) + _nbytes(do))
    if follow:
        seed_flip, replayed = _replay(flash_attention_backward, recording)
        signs_k, signs_v = flip_signs(seed_flip, [k.shape, v.shape])
        accepted = _bwd_accepted(q64, k64, v64, do64, o64, lse64, causal, sm_scale, dtype, signs_k, signs_v)
        _judge_follow(flash_attention_backward, what, ("dq", "dk", "dv"), replayed, expected, accepted,
                      bwd_products(shape) // 2)


def check_bwd_output(flash_attention_backward):
    """N a multiple of 32 (or 40), every head dim 16-128, batch and heads (as many key and
    value heads as query heads: grouped heads are check_bwd_gqa's), non-causal but for one
    of the mixed-layout calls below; non-contiguous
    inputs (the (B, N, H, D) layout of a projection, the head dimension not contiguous, windows
    of wider buffers), and two sequences of grouped heads with each input in its own layout,
    so that no tensor's strides can stand in for another's; float16 too (the interpreter
    supports it), and bfloat16 on a GPU."""
    import torch

    device, _ = _device_and_dtype(None)
    for i, shape in enumerate([(1, 1, 1, 64, 16), (1, 2, 2, 64, 32), (2, 1, 1, 64, 64), (1, 1, 1, 32, 128)]):
        _check_bwd(flash_attention_backward, shape, seed=700 + i)
    for i, (shape, layout) in enumerate([((1, 2, 2, 64, 16), "heads_inner"), ((1, 2, 2, 32, 16), "d_major"),
                                         ((1, 2, 2, 40, 16), "sliced")]):
        _check_bwd(flash_attention_backward, shape, seed=740 + i, layout=layout, follow=i == 0)
    mixed = ("heads_inner", "sliced", "heads_inner", "contiguous", "sliced")      # q, k, v, o, do
    for causal in (False, True):
        _check_bwd(flash_attention_backward, (2, 4, 2, 40, 16), causal, seed=745 + causal, layout=mixed)
    _check_bwd(flash_attention_backward, (1, 2, 2, 64, 32), seed=750, dtype=torch.float16)
    if device == "cuda":
        _check_bwd(flash_attention_backward, (2, 2, 2, 128, 64), seed=751, dtype=torch.bfloat16)
        _check_bwd(flash_attention_backward, (2, 4, 4, 96, 64), seed=752, dtype=torch.bfloat16, layout="heads_inner")


def check_bwd_ragged_causal(flash_attention_backward):
    """N = 1, N smaller than a block, N not a multiple of any block, causal and not, diagonal included."""
    for i, (shape, causal) in enumerate([((1, 1, 1, 1, 16), False), ((1, 1, 1, 1, 32), True),
                                         ((1, 2, 2, 5, 16), False), ((2, 1, 1, 17, 32), True),
                                         ((1, 1, 1, 33, 64), True), ((1, 1, 1, 67, 16), False),
                                         ((1, 2, 2, 64, 32), True), ((1, 1, 1, 96, 16), True),
                                         ((1, 1, 1, 71, 16), True)]):
        _check_bwd(flash_attention_backward, shape, causal, seed=800 + i, follow=i == 3)


def check_bwd_scale(flash_attention_backward):
    """A custom sm_scale, and large scores (P must come from the log-sum-exp, not from exp(S))."""
    for i, (shape, causal, sm_scale, magnitude) in enumerate([
            ((1, 1, 1, 64, 32), False, 0.05, 1.0), ((1, 2, 2, 64, 16), True, 1.0, 1.0),
            ((1, 1, 1, 40, 64), False, 0.3, 1.0), ((1, 1, 1, 64, 16), False, None, 8.0),
            ((1, 1, 1, 48, 32), True, None, 6.0), ((2, 2, 1, 33, 16), True, 2.0, 3.0)]):
        _check_bwd(flash_attention_backward, shape, causal, sm_scale, seed=900 + i, magnitude=magnitude,
                   follow=i == 0)


def check_bwd_gqa(flash_attention_backward):
    """Grouped-query attention: groups of 2, 3 (not a power of two) and 4 query heads, and all
    of them on one (multi-query); dK and dV must add up the query heads of each group."""
    for i, (shape, causal) in enumerate([((1, 4, 2, 40, 16), False), ((2, 4, 1, 33, 32), True),
                                         ((1, 6, 3, 64, 16), True), ((2, 8, 2, 20, 16), False),
                                         ((1, 6, 2, 40, 16), True)]):
        _check_bwd(flash_attention_backward, shape, causal, seed=1000 + i, follow=i == 0)


def check_bwd_compiles(flash_attention_backward):
    """The backward kernels, as the hidden tests launch them on a GPU (float16, causal
    and not, q of shape (1, 2, 64, 32)), must compute the gradients on these calls and
    compile for an A100 and an H100."""
    import torch

    shape, seed = (1, 2, 2, 64, 32), 750
    calls = []
    for causal in (False, True):
        inputs, _, _ = _bwd_inputs(shape, causal, None, seed=seed, dtype=torch.float16, magnitude=1.0,
                                   layout="contiguous")
        calls.append((list(inputs), {"causal": causal}))

    def computes():  # the same calls: _check_bwd draws its inputs with _bwd_inputs from the same seed
        for causal in (False, True):
            _check_bwd(flash_attention_backward, shape, causal, seed=seed, dtype=torch.float16)

    _check_compiles(flash_attention_backward, calls, "flash_attention_backward (its kernels compiled for GPUs)",
                    computes)


PAGE_SLACK = 32 * 1024  # bytes of growth, in all, that the memory cell puts down to page granularity


def bwd_overhead_allowance(d, element_size):
    """Extra bytes per token that the backward launcher may add as N grows, beyond the
    gradients: a copy of q, k, v, o and do, k and v expanded to one head per query head
    and the per-query-head dk and dv summed into the groups' afterwards (a correct way to
    handle grouped heads on the host, which copies even when the group is 1), a float32 dq
    buffer, and D and lse in float32. An N x N matrix grows by N * element bytes per token,
    1280 at the check's largest step on the CPU, against 648 allowed there."""
    return 9 * d * element_size + 4 * d + 8


def _judge_square(what, report, batch, heads, n, d, element):
    """With N > 2D no buffer the size of the inputs (or of a float32 copy) has N x N entries
    for every head, or two axes of length N: such a tensor holds P, dP or dS."""
    square = [shape for shape in report["shapes"] if sum(size == n for size in shape) >= 2]
    if n > 2 * d and (square or report["largest"] >= batch * heads * n * n * element):
        found = f"a tensor of shape {tuple(square[0])}" if square else f"a tensor of {report['largest']} bytes"
        raise GradingFailure(
            f"{what}: the launcher made {found}, the size of an N x N matrix (N = {n}). FlashAttention's backward "
            "keeps P, dP and dS as tiles inside the kernels: allocate only buffers of the size of the inputs.")


def check_bwd_memory(flash_attention_backward):
    """Memory beyond dq, dk and dv at several N, by the rules of the forward kernel's check:
    tiles of a fixed size cost the same at every N, so the overhead may grow no faster than
    bwd_overhead_allowance per token, which an N x N matrix exceeds; no buffer of N x N
    entries. Under the interpreter, the first call is also replayed: a
    launcher whose results are not computed by its kernels gets no point here either. On the
    CPU the growth is judged on the peaks seen inside the process (exact to the byte; the
    kernel's count is coarser than the growth allowed), and the peak autograde.memory finds
    (the kernel's count where larger) against a bound with room for that count's granularity."""
    import torch

    device, dtype = _device_and_dtype(None)
    d = 16 if device == "cpu" else 64
    sizes = (64, 128, 256) if device == "cpu" else (1024, 4096, 16384)
    element = torch.empty(0, dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(1100)
    overheads = []
    for n in sizes:
        q, k, v, do = (torch.randn(1, 1, n, d, generator=gen).to(dtype) for _ in range(4))
        q64, k64, v64, do64 = (t.double().numpy() for t in (q, k, v, do))
        o64, lse64 = ref.attention_with_lse(q64, k64, v64)
        expected = bwd_answer(q64, k64, v64, do64, False, None, dtype, o=o64, lse=lse64)
        o, lse = torch.from_numpy(o64).to(device=device, dtype=dtype), torch.from_numpy(lse64).float().to(device)
        q, k, v, do = (t.to(device) for t in (q, k, v, do))
        args = (q, k, v, o, lse, do)
        what = f"flash_attention_backward(q, k, v, o, lse, do with N={n}, D={d})"
        # A first call loads code and fills caches; its memory is not measured, so it also
        # records the store addresses (plain stores by several programs lose the cell), and,
        # at the first size, the call for the replay.
        first = n == sizes[0] and interpreting() and dtype == torch.float32
        _, report, recording = _launch(flash_attention_backward, args, {"causal": False}, what, record=first)
        _judge_kernels(what, report, stored_at_least=3 * _nbytes(q), loaded_at_least=2 * _nbytes(q))
        _judge_square(what, report, 1, 1, n, d, element)
        if first:
            seed_flip, replayed = _replay(flash_attention_backward, recording)
            signs_k, signs_v = flip_signs(seed_flip, [k.shape, v.shape])
            accepted = _bwd_accepted(q64, k64, v64, do64, o64, lse64, False, None, dtype, signs_k, signs_v)
            _judge_follow(flash_attention_backward, what, ("dq", "dk", "dv"), replayed, expected, accepted,
                          bwd_products((1, 1, 1, n, d)) // 2)
        if device == "cuda":
            grads, report, peak = in_student_process(probes.cuda_launcher_peak, flash_attention_backward, list(args),
                                                     {"causal": False}, what)
            exact, margin = peak, 2**20
        else:
            (grads, report, _), measured = traced_peaks(probes.traced_launcher_call, flash_attention_backward,
                                                        list(args), {"causal": False}, what, False, False)
            # At these sizes an N x N matrix is a few hundred KiB: its growth shows in the exact figure
            # from inside the process; the larger figure, which counts what hides from the process,
            # is held to a bound above the kernel's granularity.
            peak, exact, margin = measured.found, measured.inside, GRANULARITY_BYTES
        expect_sequence(grads, 3, what=what, names="(dq, dk, dv)")
        for name, value, want, bound, like in zip(("dq", "dk", "dv"), grads, *expected, (q, k, v)):
            _expect_tensor_close(f"{what}: {name}", value, want, bound, like, dtype, BWD_HINT)
        _judge_square(what, report, 1, 1, n, d, element)
        overheads.append(exact - 3 * n * d * element)
        scores = n * n * element
        if peak > scores / 4 + n * d * element * 16 + margin:
            raise GradingFailure(f"{what}: peak memory {peak / 2**20:.2f} MiB is close to the {scores / 2**20:.2f} "
                                 "MiB of an N x N matrix. Recompute P tile by tile inside the kernels.")
    per_token = (overheads[-1] - overheads[0]) / (sizes[-1] - sizes[0])
    allowed = bwd_overhead_allowance(d, element)
    # The kernel counts whole pages and the allocator's arenas: a few pages more at the largest size
    # are not growth with N (an N x N matrix adds 1 KiB per token at N = 256, D = 16).
    if per_token > allowed + PAGE_SLACK / (sizes[-1] - sizes[0]):
        raise GradingFailure(
            f"flash_attention_backward's memory beyond the gradients grew by {per_token:.0f} bytes per token from "
            f"N={sizes[0]} to N={sizes[-1]} (D={d}); at most {allowed} is allowed (copies of the inputs, D and a "
            f"float32 dq). The overheads were {', '.join(f'{o / 1024:.0f} KiB' for o in overheads)}. Kernels that "
            "loop over blocks hold tiles of a fixed size; a block that grows with N, or P built outside the "
            "kernels, makes memory grow with N.")


# ------------------------------------------------------------- split-K decoding

DECODE_HINT = ("Query head h reads key/value head h // (H_q // H_kv); only the first cache_lens[b] positions of "
               "sequence b count, and the number of chunks must cover the longest sequence (not the first); each "
               "chunk stores its (m, l, o), and the merge weighs o_c by l_c * exp(m_c - m), with m the largest "
               "score, so that large scores do not overflow. Inputs may be non-contiguous.")


def decode_products(heads, d, lens):
    """Multiply-adds of q . k for one decoding call: H_q * sum(cache_lens) * D."""
    return heads * int(sum(lens)) * d


def _check_decode(decode_attention, batch, heads, kv_heads, max_len, d, lens, sm_scale=None, *, seed, dtype=None,
                  follow=False, layout="contiguous", magnitude=1.0, lens_dtype=None):
    import torch

    device, dtype = _device_and_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    q = (magnitude * torch.randn(batch, heads, d, generator=gen)).to(dtype)
    k_cache = (magnitude * torch.randn(batch, kv_heads, max_len, d, generator=gen)).to(dtype)
    v_cache = torch.randn(batch, kv_heads, max_len, d, generator=gen).to(dtype)
    q64, k64, v64 = (t.double().numpy() for t in (q, k_cache, v_cache))
    expected = ref.decode_attention(q64, k64, v64, lens, sm_scale)
    bound = bounds.decode_bounds(q64, k64, v64, lens, sm_scale, dtype, _native())
    q, k_cache, v_cache = (_in_layout(t.to(device), kind, gen)
                           for t, kind in zip((q, k_cache, v_cache), _layouts(layout, DECODE_INPUTS)))
    cache_lens = torch.tensor(lens, dtype=lens_dtype or torch.int32, device=device)
    originals = [t.clone() for t in (q, k_cache, v_cache, cache_lens)]
    what = (f"decode_attention(q of shape {tuple(q.shape)}, caches of shape {tuple(k_cache.shape)}, cache_lens={lens}"
            f" ({str(cache_lens.dtype).removeprefix('torch.')}), {dtype}"
            + (f", sm_scale={sm_scale}" if sm_scale is not None else "")
            + _layout_words(layout, DECODE_INPUTS) + ")")
    kwargs = {} if sm_scale is None else {"sm_scale": sm_scale}
    follow = follow and interpreting() and dtype == torch.float32
    out, report, recording = _launch(decode_attention, (q, k_cache, v_cache, cache_lens), kwargs, what,
                                     record=follow)
    _expect_inputs_unchanged(what, ("q", "k_cache", "v_cache", "cache_lens"), originals,
                             (q, k_cache, v_cache, cache_lens), "write only to new buffers.")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape) or out.dtype != dtype:
        raise GradingFailure(f"{what} should return a {dtype} tensor of shape {tuple(q.shape)}, but returned "
                             f"{describe(out) if not isinstance(out, torch.Tensor) else f'{out.dtype} {tuple(out.shape)}'}.")
    _compare_outputs(what, report, _nbytes(q), q.shape[-1],
                     [lambda: _expect_tensor_close(what, out, expected, bound, q, dtype, DECODE_HINT)])
    _judge_kernels(what, report, stored_at_least=_nbytes(q), loaded_at_least=_nbytes(q))
    if follow:
        seed_flip, replayed = _replay(decode_attention, recording)
        signs_k, signs_v = flip_signs(seed_flip, [k_cache.shape, v_cache.shape])
        k2, v2 = k64 * signs_k, v64 * signs_v
        accepted = [([ref.decode_attention(q64, k2, v2, lens, sm_scale)],
                     [bounds.decode_bounds(q64, k2, v2, lens, sm_scale, dtype, _native())])]
        _judge_follow(decode_attention, what, ("the output",), replayed, ([expected], [bound]), accepted,
                      decode_products(heads, d, lens) // 2)
    return report


def check_decode_output(decode_attention):
    """Caches of 1 to 300 positions with per-sequence lengths (1, full, ragged, a first sequence
    much shorter than later ones), query groups of 1 (multi-head), 2, 3, 4 and 8 (multi-query),
    head dims 16-128, a custom sm_scale, large scores, int32 and int64 lengths, non-contiguous
    inputs (a window of a longer preallocated cache, the (B, L, H, D) layout, the two caches in
    different layouts); float16 too."""
    import torch

    device, _ = _device_and_dtype(None)
    for i, (batch, heads, kv_heads, max_len, d, lens, scale) in enumerate([
            (1, 1, 1, 1, 16, [1], None), (2, 2, 2, 40, 32, [40, 7], None), (3, 4, 2, 100, 64, [1, 100, 65], None),
            (1, 8, 1, 300, 16, [257], 0.5), (2, 4, 4, 64, 128, [64, 33], None), (2, 6, 3, 130, 32, [129, 2], 0.1),
            (2, 2, 1, 300, 16, [3, 300], None), (2, 6, 2, 80, 32, [80, 17], None),
            (1, 8, 2, 50, 16, [50], None)]):
        _check_decode(decode_attention, batch, heads, kv_heads, max_len, d, lens, scale, seed=1200 + i,
                      follow=i == 2)
    _check_decode(decode_attention, 2, 4, 2, 120, 32, [20, 120], seed=1242, layout="sliced", lens_dtype=torch.int64)
    _check_decode(decode_attention, 2, 2, 1, 90, 16, [90, 31], seed=1243, layout="heads_inner", magnitude=12.0)
    _check_decode(decode_attention, 2, 4, 2, 60, 16, [60, 23], seed=1244,
                  layout=("contiguous", "sliced", "heads_inner"))           # q, k_cache, v_cache
    _check_decode(decode_attention, 2, 4, 2, 96, 32, [96, 50], seed=1250, dtype=torch.float16)
    if device == "cuda":
        _check_decode(decode_attention, 2, 8, 2, 4096, 128, [4096, 1000], seed=1251, dtype=torch.bfloat16)
        _check_decode(decode_attention, 3, 8, 2, 4096, 128, [7, 4096, 2500], seed=1252, dtype=torch.bfloat16,
                      layout="sliced")


def _judge_cache_copies(what, report, window, kernel_launches):
    """Decoding reads the cache where it lies: no tensor made by the launcher's PyTorch code (a
    copy, a cast, a buffer for a kernel to copy into) holds half the bytes of one cache window,
    and (interpreter) no kernel launch stores that much."""
    if 2 * report["largest_new"] >= window:
        raise GradingFailure(
            f"{what}: the launcher made a tensor of {report['largest_new']} bytes, at least half of the {window} bytes "
            "of a cache window: a copy of the cache (or a buffer to copy it into), or the partial states of chunks "
            "so short that they weigh that much. A decoding step is bound by the bytes it reads, and a copy reads and "
            "writes the cache once more. Read the caches in place, through their strides (batch, head, position); "
            "chunks of 64 positions or more keep the partial states small.")
    copying = [(p, ld, st) for p, ld, st in kernel_launches if ld is not None and 2 * st >= window]
    if copying:
        raise GradingFailure(
            f"{what}: a kernel launch stored {copying[0][2]} bytes, at least half of the {window} bytes of a cache "
            "window: a copy of the cache. Read the caches in place, through their strides (batch, head, position).")


def check_decode_in_place(decode_attention):
    """Caches of 1024 and 700 positions that are the first positions of longer preallocated
    buffers, in the (B, H_kv, L, D) layout and in the (B, L, H_kv, D) layout seen as
    (B, H_kv, L, D): right outputs, and the caches read in place (_judge_cache_copies)."""
    import torch

    batch, heads, kv_heads, max_len, d, lens = 2, 4, 2, 1024, 32, [1024, 700]
    _, dtype = _device_and_dtype(None)
    window = batch * kv_heads * max_len * d * torch.empty(0, dtype=dtype).element_size()
    for seed, layout in ((1310, "window"), (1311, "heads_inner_window")):
        report = _check_decode(decode_attention, batch, heads, kv_heads, max_len, d, lens, seed=seed, layout=layout)
        _judge_cache_copies(f"decode_attention on caches of {lens} positions (windows of longer buffers, "
                            f"{layout.replace('_', ' ')})", report, window, [entry[1:] for entry in report["log"]])


def check_decode_split(decode_attention):
    """A long cache (2048, 1500 and 9 positions) for 3 sequences of 4 query heads: the launch that
    reads the cache and reduces it must have more programs than (sequence, query head) pairs.
    The 9-position sequence leaves chunks with no keys for any chunk length below 2048 (the
    shorter caches of the other checks have none for chunk lengths from 1024 on).
    Under the interpreter that launch is found by its bytes: it loads at least a quarter of the
    valid cache and stores less than a quarter of what it loads (a copy or a cast of the cache
    stores as much as it loads, and does not count); on a GPU, the largest grid must be split.
    Under the interpreter a shorter call is first replayed: a launcher whose results are not
    computed by its kernels gets no point here either."""
    import torch

    _check_decode(decode_attention, 2, 4, 2, 128, 32, [128, 90], seed=1301, follow=True)
    batch, heads, kv_heads, max_len, d, lens = 3, 4, 2, 2048, 64, [2048, 1500, 9]
    launches = [entry[1:] for entry in _check_decode(decode_attention, batch, heads, kv_heads, max_len, d, lens,
                                                     seed=1300)["log"]]
    _, dtype = _device_and_dtype(None)
    advice = ("one program then reads a whole cache alone while the rest of the GPU idles. Split the cache into "
              "chunks, one program per (chunk, sequence, head), then merge the chunks' partial states.")
    if launches and launches[0][1] is not None:
        cache = 2 * sum(lens) * kv_heads * d * torch.empty(0, dtype=dtype).element_size()
        reading = [(p, ld, st) for p, ld, st in launches if 4 * ld >= cache and 4 * st < ld]
        if not reading:
            raise GradingFailure(
                f"decode_attention on caches of {lens} positions: no kernel launch read the cache and reduced it "
                f"(launches as (programs, bytes loaded, bytes stored): {[tuple(x) for x in launches]}; the valid "
                f"cache holds {cache} bytes). The attention over the cache must run in your kernels.")
        small = [p for p, _, _ in reading if p <= batch * heads]
        if small:
            raise GradingFailure(
                f"decode_attention on caches of {lens} positions: the kernel that reads the cache ran {small[0]} "
                f"programs, no more than one per (sequence, query head) ({batch * heads}): " + advice)
        return
    grids = [p for p, _, _ in launches if p is not None]
    if not grids or max(grids) <= batch * heads:
        raise GradingFailure(
            f"decode_attention on a cache of {max_len} positions launched grids of {grids} programs, never more than "
            f"one program per (sequence, query head) ({batch * heads}): " + advice)


def check_decode_compiles(decode_attention):
    """The decoding kernels, as the hidden tests launch them on a GPU (float16, caches of
    96 and 50 positions, 4 query heads sharing 2), must compute the attention on this call
    and compile for an A100 and an H100."""
    import torch

    device, _ = _device_and_dtype(None)
    gen = torch.Generator().manual_seed(1250)
    q = torch.randn(2, 4, 32, generator=gen).half()
    k_cache, v_cache = (torch.randn(2, 2, 96, 32, generator=gen).half() for _ in range(2))
    lens = torch.tensor([96, 50], dtype=torch.int32)
    calls = [([t.to(device) for t in (q, k_cache, v_cache, lens)], {})]

    def computes():  # the same call: _check_decode draws q and the caches in this order from the same seed
        _check_decode(decode_attention, 2, 4, 2, 96, 32, [96, 50], seed=1250, dtype=torch.float16)

    _check_compiles(decode_attention, calls, "decode_attention (its kernels compiled for GPUs)", computes)
