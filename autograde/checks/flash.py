"""Hidden checks for Chapter 4 (FlashAttention).

The NumPy exercises are compared with autograde.reference.flash over many shapes.
The Triton kernel is graded for output, memory and for being a kernel: every
call runs under autograde.triton_trace (kernel launches, and under the
interpreter the bytes each kernel loads and stores) and a PyTorch dispatch mode
that records the operators the launcher uses."""

import numpy as np

from autograde.compare import (GradingFailure, call, call_unchanged, describe, expect_close, expect_int,
                               expect_sequence)
from autograde.memory import traced_peak
from autograde.sandbox import in_student_process
from student_runtime import probes
from autograde.reference import flash as ref

RNG_SEED = 20264


def _rng(offset=0):
    return np.random.default_rng(RNG_SEED + offset)


# ------------------------------------------------------------- online softmax statistics

STATS_HINT = ("Keep a running max m and a running sum l; for each block, m_new = max(m, max(block)) and "
              "l = l * exp(m - m_new) + sum(exp(block - m_new)). A row that is all -inf has m = -inf, l = 0.")


def _expect_stats(found, x, block_size):
    what = f"online_softmax_stats(x of shape {x.shape}, block_size={block_size})"
    expect_sequence(found, 2, what=what, names="(m, l)")
    m_ref, l_ref = ref.online_softmax_stats(x, block_size)
    for name, value, expected in (("m", found[0], m_ref), ("l", found[1], l_ref)):
        label = f"{what}: {name}"
        if isinstance(value, (float, np.floating)):
            value = np.asarray(value)
        if not isinstance(value, np.ndarray) or value.shape != expected.shape:
            raise GradingFailure(f"{label} should be an array of shape {expected.shape} (x's shape without its last "
                                 f"axis), but is {describe(value)}.")
        empty = np.isneginf(expected)
        if not np.array_equal(np.isneginf(value), empty):
            row = tuple(int(i) for i in np.argwhere(np.isneginf(value) != empty)[0])
            raise GradingFailure(f"{label} at row {row}: expected {expected[row]}, found {value[row]}. {STATS_HINT}")
        expect_close(np.where(empty, 0.0, value), np.where(empty, 0.0, expected), what=label,
                     rtol=1e-10, atol=1e-12, hint=STATS_HINT)


def _check_stats(fn, x, block_size):
    what = f"online_softmax_stats(x of shape {x.shape}, block_size={block_size})"
    _expect_stats(call_unchanged(fn, x, block_size, what=what), x, block_size)


def check_stats_values(online_softmax_stats):
    """Random rows, 1-D to 3-D, with block sizes that divide the row, do not, or exceed it."""
    rng = _rng(1)
    for shape in [(1,), (7,), (3, 10), (2, 3, 17), (4, 64)]:
        x = rng.normal(scale=3.0, size=shape)
        for block_size in (1, 3, 4, shape[-1], shape[-1] + 5):
            _check_stats(online_softmax_stats, x, block_size)


def check_stats_extreme(online_softmax_stats):
    """Values near ±1e4 (a naive exp overflows), -inf entries from masks, a first
    block that is entirely -inf, and a row that is entirely -inf."""
    rng = _rng(2)
    x = rng.normal(size=(6, 23))
    x[0] *= 1e4                       # huge magnitudes
    x[1] = x[1] * 1e4 - 5e4          # all very negative
    x[2, ::3] = -np.inf              # masked entries
    x[3, :9] = -np.inf               # the first blocks see only -inf
    x[4] = -np.inf                   # nothing to attend to
    x[5, -1] = 1e4                   # the max arrives in the last block
    for block_size in (1, 4, 8, 23):
        _check_stats(online_softmax_stats, x, block_size)


# ------------------------------------------------------------- tiled attention (NumPy)

TILED_HINT = ("For each block of queries, keep m, l and an unnormalised output; for each key block rescale "
              "them by exp(m_old - m_new) before adding the new block. Scores are scaled by 1/sqrt(d).")


def _check_tiled(fn, q, k, v, block_m, block_n, causal):
    what = (f"tiled_attention(q {q.shape}, k {k.shape}, v {v.shape}, block_m={block_m}, block_n={block_n}, "
            f"causal={causal})")
    found = call_unchanged(fn, q, k, v, block_m, block_n, causal=causal, what=what)
    expect_close(found, ref.attention(q, k, v, causal), what=what, rtol=1e-9, atol=1e-11, hint=TILED_HINT)


def check_tiled_output(tiled_attention):
    """Non-causal: blocks that divide n, that do not, larger than n, of size 1;
    fewer or more keys than queries; d_v != d; leading batch axes."""
    rng = _rng(3)
    cases = [((), 8, 8, 4, 4, 4, 4), ((), 10, 10, 3, 5, 3, 4), ((), 1, 1, 2, 1, 1, 3), ((), 7, 7, 5, 32, 32, 5),
             ((), 5, 13, 4, 2, 4, 2), ((), 12, 3, 3, 4, 2, 6), ((2,), 9, 9, 4, 4, 3, 3), ((2, 3), 6, 11, 2, 4, 5, 3)]
    for batch, n_q, n_k, d, block_m, block_n, d_v in cases:
        q, k = rng.normal(size=batch + (n_q, d)), rng.normal(size=batch + (n_k, d))
        v = rng.normal(size=batch + (n_k, d_v))
        _check_tiled(tiled_attention, q, k, v, block_m, block_n, False)


def check_tiled_causal(tiled_attention):
    """Causal: query i sees keys 0..i, with blocks of unequal sizes and ragged n."""
    rng = _rng(4)
    for batch, n, d, block_m, block_n in [((), 1, 3, 4, 4), ((), 8, 4, 4, 4), ((), 10, 4, 3, 4), ((), 10, 4, 4, 3),
                                          ((), 17, 5, 16, 2), ((3,), 9, 2, 2, 5), ((2, 2), 7, 3, 7, 1)]:
        q, k, v = (rng.normal(size=batch + (n, d)) for _ in range(3))
        _check_tiled(tiled_attention, q, k, v, block_m, block_n, True)


def check_tiled_extreme(tiled_attention):
    """Scores of size several hundred, whose maximum moves between key blocks."""
    rng = _rng(5)
    for scale in (10.0, 40.0):
        q, k, v = rng.normal(scale=scale, size=(12, 4)), rng.normal(scale=scale, size=(12, 4)), rng.normal(size=(12, 3))
        _check_tiled(tiled_attention, q, k, v, 4, 3, False)
        _check_tiled(tiled_attention, q, k, v, 5, 2, True)


def tiled_memory_budget(n, d, d_v, block_m, block_n):
    """What a tiled pass may hold at once, in bytes of float64: eight arrays the
    size of one block_m x block_n tile (scores, weights and their temporaries),
    three arrays the size of all the inputs (copies, the output, running state),
    and 64 KiB of slack."""
    return 8 * (8 * block_m * block_n + 3 * n * (2 * d + d_v)) + 2**16


def check_tiled_memory(tiled_attention):
    """Peak memory at n = 1024 and 4096 with 64 x 64 tiles and narrow heads (d = 4,
    so that copies of the inputs are small next to a strip of scores) must stay
    within tiled_memory_budget: a 64 x n strip of scores or an n x n matrix does not."""
    rng = _rng(6)
    d, block = 4, 64
    for n in (1024, 4096):
        q, k, v = (rng.normal(size=(n, d)) for _ in range(3))
        what = f"tiled_attention for n={n}, d={d}, block_m=block_n={block}"
        found, peak = traced_peak(call, tiled_attention, q, k, v, block, block, what=what)
        expect_close(found, ref.attention(q, k, v), what=what, rtol=1e-9, atol=1e-11, hint=TILED_HINT)
        budget = tiled_memory_budget(n, d, d, block, block)
        if peak > budget:
            raise GradingFailure(
                f"{what}: peak memory was {peak / 2**20:.2f} MiB, more than the {budget / 2**20:.2f} MiB a tiled pass "
                f"needs (a few {block} x {block} tiles plus copies of the inputs). A score array of {block} x {n} "
                f"or {n} x {n} entries is being built: loop over key blocks too, holding one tile at a time.")


# ------------------------------------------------------------- the IO model

def check_traffic_standard(hbm_traffic_standard):
    for n, d in [(1, 1), (2, 3), (64, 64), (100, 16), (1024, 128), (4096, 64), (10**6, 128), (10**9, 256)]:
        what = f"hbm_traffic_standard(n={n}, d={d})"
        expect_int(call(hbm_traffic_standard, n, d, what=what), ref.hbm_traffic_standard(n, d), what=what,
                    hint="Read Q and K, write S; read S, write P; read P and V, write O.")


def check_traffic_flash(hbm_traffic_flash):
    for n, d, block_m in [(1, 1, 1), (8, 4, 8), (8, 4, 3), (100, 16, 64), (64, 64, 128), (1000, 64, 7),
                          (4096, 128, 128), (10**6 + 1, 64, 128), (10**9, 128, 10**5 + 3)]:
        what = f"hbm_traffic_flash(n={n}, d={d}, block_m={block_m})"
        expect_int(call(hbm_traffic_flash, n, d, block_m, what=what), ref.hbm_traffic_flash(n, d, block_m),
                    what=what, hint="Q is read and O written once; each of the ceil(n / block_m) query blocks reads "
                                    "all of K and V. Use integer ceiling division.")


# ------------------------------------------------------------- the Triton kernel

def _tolerances(dtype):
    """float32: the interpreter's products are exact float32 (rtol 1e-4 leaves room for
    a different summation order). float16/bfloat16 on a GPU: P is rounded to the input
    type before P @ V, an error of about one unit in the last place of 2^-11 (fp16)
    or 2^-8 (bf16) relative to outputs of size about 1. TF32 does not arise: on a GPU
    the inputs are 16-bit, and tl.dot on 16-bit operands multiplies exactly and
    accumulates in float32, whatever input_precision says."""
    import torch

    return {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 5e-3), torch.bfloat16: (5e-2, 3e-2)}[dtype]


def _check_flash(flash_attention, shape, causal=False, sm_scale=None, *, seed, dtype=None, magnitude=1.0,
                 layout="contiguous"):
    import torch

    from coursekit.triton_env import triton_device

    device = triton_device(quiet=True)
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    gen = torch.Generator().manual_seed(seed)
    batch, heads, n, d = shape
    if layout == "transposed":      # (B, N, H, D) memory viewed as (B, H, N, D), as after a head split
        make = lambda: torch.randn(batch, n, heads, d, generator=gen).transpose(1, 2)  # noqa: E731
    else:
        make = lambda: torch.randn(batch, heads, n, d, generator=gen)  # noqa: E731
    q, k, v = (magnitude * make() if name != "v" else make() for name in "qkv")
    expected = ref.attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), causal, sm_scale)
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    originals = [t.clone() for t in (q, k, v)]
    what = (f"flash_attention(q, k, v of shape {tuple(shape)}, {dtype}, causal={causal}"
            + (f", sm_scale={sm_scale}" if sm_scale is not None else "") + (", non-contiguous" if layout != "contiguous" else "")
            + ")")
    out, _ = in_student_process(probes.flash_traced_call, flash_attention, q, k, v, causal, sm_scale, what)
    if not isinstance(out, torch.Tensor):
        raise GradingFailure(f"{what} should return a torch.Tensor, but returned {describe(out)}.")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != q.device:
        raise GradingFailure(f"{what} should return a {dtype} tensor of shape {tuple(shape)} on {q.device}, "
                             f"but returned {out.dtype} of shape {tuple(out.shape)} on {out.device}.")
    for name, before, after in zip("qkv", originals, (q, k, v)):
        if not torch.equal(before, after):
            raise GradingFailure(f"{what} changed its input {name}; write only to the output.")
    rtol, atol = _tolerances(dtype)
    hint = ("Check the masks for the last, partial block (rows and columns >= N), the causal condition "
            "(key j <= query i), the rescaling of the accumulator by exp(m_old - m_new), and that scores are "
            "scaled once, by sm_scale (default 1/sqrt(D)).")
    expect_close(out.detach().double().cpu().numpy(), expected, what=what, rtol=rtol, atol=atol, hint=hint)


def check_flash_output(flash_attention):
    """Non-causal, N a multiple of 16, 32 and 64 (so no ragged block), every head dim 16-128, batch and heads.
    On a GPU also bfloat16 (the interpreter has no bfloat16 arithmetic, so not on the CPU)."""
    import torch

    from coursekit.triton_env import triton_device

    for i, shape in enumerate([(1, 1, 64, 16), (1, 2, 64, 32), (2, 1, 128, 64), (1, 1, 64, 128), (2, 2, 64, 16)]):
        _check_flash(flash_attention, shape, seed=100 + i)
    if triton_device(quiet=True) == "cuda":
        _check_flash(flash_attention, (2, 2, 128, 64), seed=150, dtype=torch.bfloat16)


def check_flash_ragged(flash_attention):
    """N = 1, N smaller than a block, and N not a multiple of any power-of-two block."""
    for i, (shape, causal) in enumerate([((1, 1, 1, 16), False), ((1, 1, 1, 32), True), ((1, 2, 5, 16), False),
                                         ((2, 1, 17, 32), False), ((1, 1, 33, 64), True), ((1, 1, 100, 16), False),
                                         ((1, 1, 67, 128), True)]):
        _check_flash(flash_attention, shape, causal, seed=200 + i)


def check_flash_causal(flash_attention):
    """Causal masking, including the diagonal, over several blocks and heads."""
    for i, shape in enumerate([(1, 1, 16, 16), (2, 2, 64, 32), (1, 1, 96, 64), (1, 2, 128, 16)]):
        _check_flash(flash_attention, shape, True, seed=300 + i)


def check_flash_scale(flash_attention):
    """A custom sm_scale, and large scores (the running max must rescale); N a multiple of 32."""
    for i, (shape, causal, sm_scale, magnitude) in enumerate([
            ((1, 1, 64, 32), False, 0.05, 1.0), ((1, 2, 64, 16), True, 1.0, 1.0), ((1, 1, 128, 64), False, 0.3, 1.0),
            ((1, 1, 64, 16), False, None, 12.0), ((1, 1, 96, 32), True, None, 8.0)]):
        _check_flash(flash_attention, shape, causal, sm_scale, seed=400 + i, magnitude=magnitude)


def check_flash_strides(flash_attention):
    """Inputs that are views with non-standard strides (heads split from (B, N, H, D))."""
    for i, (shape, causal) in enumerate([((2, 3, 32, 16), False), ((1, 2, 48, 32), True)]):
        _check_flash(flash_attention, shape, causal, seed=500 + i, layout="transposed")


def flash_overhead_allowance(d, element_size):
    """Extra bytes per token that the launcher may add as N grows, beyond the output
    and the log-sum-exp: one copy of q, k, v and the output."""
    return 4 * d * element_size


def check_flash_memory(flash_attention):
    """Memory beyond the output and the log-sum-exp, measured at several N.

    CPU (interpreter): NumPy allocations (the kernel's tiles) through tracemalloc
    plus PyTorch's tensors through a dispatch mode. Tiles of fixed size cost the
    same at every N; the overhead may grow no faster than one copy of the inputs
    and output per token, which a BLOCK_M x N strip of scores or an N x N matrix
    exceeds. GPU: torch.cuda.max_memory_allocated, the same rule."""
    import torch

    from coursekit.triton_env import triton_device

    device = triton_device(quiet=True)
    dtype = torch.float16 if device == "cuda" else torch.float32
    d = 16 if device == "cpu" else 64
    sizes = (128, 256, 512) if device == "cpu" else (1024, 4096, 16384)
    element = torch.empty(0, dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(600)
    overheads = []
    for n in sizes:
        q, k, v = (torch.randn(1, 1, n, d, generator=gen).to(device=device, dtype=dtype) for _ in range(3))
        what = f"flash_attention(q, k, v of shape (1, 1, {n}, {d}))"
        call(flash_attention, q, k, v, what=what)   # a first call at each size loads code and fills caches
        if device == "cuda":
            out, peak = in_student_process(probes.cuda_flash_peak, flash_attention, q, k, v, what)
        else:
            (out, _), peak = traced_peak(probes.flash_traced_call, flash_attention, q, k, v, False, None, what)
        expected = ref.attention(q.double().cpu().numpy(), k.double().cpu().numpy(), v.double().cpu().numpy())
        expect_close(out.detach().double().cpu().numpy(), expected, what=what, rtol=_tolerances(dtype)[0],
                     atol=_tolerances(dtype)[1])
        overheads.append(peak - n * d * element - 8 * n)      # output, and a log-sum-exp even in float64
        scores = n * n * element
        if peak > scores / 4 + n * d * element * 8 + 2**20:
            raise GradingFailure(f"{what}: extra peak memory {peak / 2**20:.2f} MiB is close to the "
                                 f"{scores / 2**20:.2f} MiB of an N x N score matrix. Never materialise the scores.")
    per_token = (overheads[-1] - overheads[0]) / (sizes[-1] - sizes[0])
    allowed = flash_overhead_allowance(d, element)
    if per_token > allowed:
        raise GradingFailure(
            f"flash_attention's memory beyond the output grew by {per_token:.0f} bytes per token from N={sizes[0]} to "
            f"N={sizes[-1]} (d={d}); at most {allowed} (one copy of q, k, v and the output) is allowed. The overheads "
            f"were {', '.join(f'{o / 1024:.0f} KiB' for o in overheads)}. A kernel that loops over blocks of keys "
            "holds tiles of a fixed size; a BLOCK_N that grows with N (a whole row of scores) or scores built "
            "outside the kernel make memory grow with N.")
