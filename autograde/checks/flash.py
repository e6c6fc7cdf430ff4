"""Hidden checks for Chapter 4 (FlashAttention): merging softmax states, the
backward pass in NumPy and in Triton, its HBM traffic, and split-K decoding.

The NumPy exercises are compared with autograde.reference.flash over many shapes.
The Triton launchers are graded for output, memory and for being kernels: every
call runs in the student's process under coursekit.triton_trace (kernel
launches, and under the interpreter the bytes each kernel loads and stores) and
a PyTorch dispatch mode that records the operators the launcher uses. Under
the interpreter, one call per check also flips the signs of the keys as the
kernels load them, and the results must follow (a launcher that computes on
the host and has a kernel copy the answer out cannot). Expected answers are
computed from private float64 copies before the student is called."""

import secrets

import numpy as np

from autograde.compare import (GradingFailure, call, call_unchanged, describe, expect_close, expect_int,
                               expect_sequence)
from autograde.memory import traced_peak
from autograde.reference import flash as ref
from autograde.sandbox import in_student_process, note_sighting
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
    stacked on a new first axis: what a split-K pass stores per chunk."""
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


def _check_merge(fn, scores, v, bounds):
    m, l, o = chunk_states(scores, v, bounds)
    what = f"merge_softmax_states(m {m.shape}, l {l.shape}, o {o.shape}) for key chunks {bounds}"
    expected = ref.merge_softmax_states(m, l, o)
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
        expect_close(np.where(empty, 0.0, value), np.where(empty, 0.0, want), what=label,
                     rtol=1e-10, atol=1e-12, hint=MERGE_HINT)


def check_merge_values(merge_softmax_states):
    """Two to five chunks of unequal sizes; one row, a batch of rows, two leading axes; d_v from 1 to 5."""
    rng = _rng(11)
    for lead, n, d_v, bounds in [((), 6, 3, [(0, 3), (3, 6)]), ((4,), 10, 2, [(0, 4), (4, 7), (7, 10)]),
                                 ((2, 3), 9, 5, [(0, 1), (1, 2), (2, 8), (8, 9)]), ((5,), 12, 1, [(0, 12)]),
                                 ((3,), 11, 4, [(6, 11), (0, 2), (2, 6)]), ((2,), 15, 3, [(0, 3)] + [(a, a + 3) for a in range(3, 15, 3)])]:
        scores = rng.normal(scale=2.0, size=lead + (n,))
        _check_merge(merge_softmax_states, scores, rng.normal(size=lead + (n, d_v)), bounds)


def check_merge_extreme(merge_softmax_states):
    """Scores near ±1e3 (exp(m) overflows), empty chunks (m = -inf, l = 0), a row whose
    chunks are all empty, and a chunk whose max is far below the others (its weight underflows to 0)."""
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
    for name, value, want in zip(("dq", "dk", "dv"), found, expected):
        expect_close(value, want, what=f"{what}: {name}", rtol=1e-8, atol=1e-10, hint=TILED_BWD_HINT)


def check_tiled_bwd_output(tiled_attention_backward):
    """Non-causal: blocks that divide n, that do not, larger than n, of size 1; fewer or
    more keys than queries; d_v != d; one and two leading batch axes."""
    rng = _rng(13)
    for batch, n_q, n_k, d, d_v, block_m, block_n in [((), 8, 8, 4, 4, 4, 4), ((), 10, 10, 3, 3, 3, 4),
                                                      ((), 1, 1, 2, 2, 1, 3), ((), 7, 7, 5, 3, 32, 32),
                                                      ((), 5, 13, 4, 2, 2, 4), ((), 12, 3, 3, 6, 4, 2),
                                                      ((2,), 9, 9, 4, 3, 4, 3), ((2, 3), 6, 11, 2, 3, 4, 5)]:
        q, k = rng.normal(size=batch + (n_q, d)), rng.normal(size=batch + (n_k, d))
        v, do = rng.normal(size=batch + (n_k, d_v)), rng.normal(size=batch + (n_q, d_v))
        _check_tiled_bwd(tiled_attention_backward, q, k, v, do, block_m, block_n, False)


def check_tiled_bwd_causal(tiled_attention_backward):
    """Causal: query i sees keys 0..i, with blocks of unequal sizes, ragged n and batch axes."""
    rng = _rng(14)
    for batch, n, d, block_m, block_n in [((), 1, 3, 4, 4), ((), 8, 4, 4, 4), ((), 10, 4, 3, 4), ((), 10, 4, 4, 3),
                                          ((), 17, 5, 16, 2), ((3,), 9, 2, 2, 5), ((2, 2), 7, 3, 7, 1)]:
        q, k, v, do = (rng.normal(size=batch + (n, d)) for _ in range(4))
        _check_tiled_bwd(tiled_attention_backward, q, k, v, do, block_m, block_n, True)


def check_tiled_bwd_extreme(tiled_attention_backward):
    """Scores of size several hundred (exp(S) overflows unless P is recomputed as exp(S - lse))."""
    rng = _rng(15)
    for scale in (10.0, 40.0):
        q, k = rng.normal(scale=scale, size=(12, 4)), rng.normal(scale=scale, size=(12, 4))
        v, do = rng.normal(size=(12, 3)), rng.normal(size=(12, 3))
        _check_tiled_bwd(tiled_attention_backward, q, k, v, do, 4, 3, False)
        _check_tiled_bwd(tiled_attention_backward, q, k, v, do, 5, 2, True)


def tiled_bwd_memory_budget(n, d, block_m, block_n):
    """What a tiled backward may hold at once, in bytes of float64: twelve arrays the size of
    one block_m x block_n tile (P, dP, dS and their temporaries), twelve arrays the size of
    one n x d input (copies, the three gradients), four of n numbers, and 64 KiB of slack."""
    return 8 * (12 * block_m * block_n + 12 * n * d + 4 * n) + 2**16


def check_tiled_bwd_memory(tiled_attention_backward):
    """Peak memory at n = 1024 and 4096 with 64 x 64 tiles and d = 4 must stay within
    tiled_bwd_memory_budget: a 64 x n strip of P or an n x n matrix does not."""
    rng = _rng(16)
    d, block = 4, 64
    for n in (1024, 4096):
        q, k, v, do = (rng.normal(size=(n, d)) for _ in range(4))
        o, lse = ref.attention_with_lse(q, k, v)
        expected = ref.attention_backward(q, k, v, do)
        what = f"tiled_attention_backward for n={n}, d={d}, block_m=block_n={block}"
        found, peak = traced_peak(call, tiled_attention_backward, q, k, v, o, do, lse, block, block, what=what)
        expect_sequence(found, 3, what=what, names="(dq, dk, dv)")
        for name, value, want in zip(("dq", "dk", "dv"), found, expected):
            expect_close(value, want, what=f"{what}: {name}", rtol=1e-8, atol=1e-10, hint=TILED_BWD_HINT)
        budget = tiled_bwd_memory_budget(n, d, block, block)
        if peak > budget:
            raise GradingFailure(
                f"{what}: peak memory was {peak / 2**20:.2f} MiB, more than the {budget / 2**20:.2f} MiB a tiled "
                f"backward needs (a few {block} x {block} tiles plus copies of the inputs and the gradients). An "
                f"array of {block} x {n} or {n} x {n} entries is being built: recompute P one tile at a time.")


# ------------------------------------------------------------- the backward pass's traffic

def check_traffic_backward(hbm_traffic_backward):
    for n, d, block_m, block_n in [(1, 1, 1, 1), (8, 4, 8, 8), (8, 4, 3, 5), (100, 16, 64, 32), (64, 64, 128, 16),
                                   (1000, 64, 7, 13), (4096, 128, 128, 64), (10**6 + 1, 64, 128, 64),
                                   (10**9, 128, 10**5 + 3, 257)]:
        what = f"hbm_traffic_backward(n={n}, d={d}, block_m={block_m}, block_n={block_n})"
        expect_int(call(hbm_traffic_backward, n, d, block_m, block_n, what=what),
                   ref.hbm_traffic_backward(n, d, block_m, block_n), what=what,
                   hint="D: read O and dO, write D. dK/dV pass: K, V read and dK, dV written once; each of the "
                        "ceil(n / block_n) key blocks reads Q, dO, lse and D. dQ pass: Q, dO, lse, D read and dQ "
                        "written once; each of the ceil(n / block_m) query blocks reads K and V. Use integer "
                        "ceiling division.")


# ------------------------------------------------------------- the backward kernels in Triton

def _tolerances(dtype):
    """float32: the interpreter's products are exact float32 (rtol 1e-4 leaves room for
    a different summation order). float16/bfloat16 on a GPU: P is rounded to the input
    type before P @ V, an error of about one unit in the last place of 2^-11 (fp16)
    or 2^-8 (bf16) relative to outputs of size about 1. TF32 does not arise: on a GPU
    the inputs are 16-bit, and tl.dot on 16-bit operands multiplies exactly and
    accumulates in float32, whatever input_precision says."""
    import torch

    return {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 5e-3), torch.bfloat16: (5e-2, 3e-2)}[dtype]



BWD_HINT = ("Check D = rowsum(dO * O), P = exp(sm_scale * QK^T - lse) with the masks for the ragged last block and "
            "the causal condition (key j <= query i), dS = P * (dP - D), the factor sm_scale in dQ and dK, and, "
            "when k and v have fewer heads than q, that dK and dV add up every query head of the group.")


def _device_and_dtype(dtype):
    import torch

    from coursekit.triton_env import triton_device

    device = triton_device(quiet=True)
    return device, dtype or (torch.float16 if device == "cuda" else torch.float32)


def _random_signs(shape):
    """+1 or -1 at random for every element; fresh each run, so that nothing in
    the student's process can know it ahead."""
    return np.random.default_rng(secrets.randbits(64)).choice(np.array([-1.0, 1.0]), size=tuple(shape))


# The integrity report's reason when results do not follow the kernels' loads.
FOLLOW_SIGHTING = "results computed outside the Triton kernels"
FOLLOW_HINT = ("While this call ran, the grader changed the signs of some keys as your kernels loaded them; what your "
               "kernels compute follows such a change, anything computed outside them (on the host, by NumPy or "
               "PyTorch, or before the launch) does not. Compute the results in your kernels from what they load.")


def _judge_follow(fn, what, results, *, followed, unchanged, hint):
    """The verdict on a call whose loaded keys had some signs flipped: the results
    must follow them. Results that did not change at all were computed outside the
    kernels (reported for a person to look at); other wrong ones hold only for
    some inputs."""
    if followed:
        return
    if unchanged:
        note_sighting(fn, FOLLOW_SIGHTING, f"{what}: {results} did not follow")
        raise GradingFailure(f"{what}: {results} did not follow the keys your kernels loaded. {FOLLOW_HINT}")
    raise GradingFailure(f"{what}: right for these inputs, but wrong once the grader changed the signs of some keys "
                         f"as your kernels loaded them: {hint}")


def _check_bwd(flash_attention_backward, shape, causal=False, sm_scale=None, *, seed, dtype=None, magnitude=1.0,
               follow=False):
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
    expected = ref.attention_backward(q64, k64, v64, do64, causal, sm_scale)
    o = torch.from_numpy(o64).to(device=device, dtype=dtype)
    lse = torch.from_numpy(lse64).to(device=device, dtype=torch.float32)
    q, k, v, do = (t.to(device) for t in (q, k, v, do))
    originals = [t.clone() for t in (q, k, v, o, lse, do)]
    what = (f"flash_attention_backward(q of shape {tuple(q.shape)}, k and v of shape {tuple(k.shape)}, {dtype}, "
            f"causal={causal}" + (f", sm_scale={sm_scale}" if sm_scale is not None else "") + ")")
    found = in_student_process(probes.backward_traced_call, flash_attention_backward, q, k, v, o, lse, do, causal,
                               sm_scale, what)
    expect_sequence(found, 3, what=what, names="(dq, dk, dv)")
    for name, before, after in zip(("q", "k", "v", "o", "lse", "do"), originals, (q, k, v, o, lse, do)):
        if not torch.equal(before, after):
            raise GradingFailure(f"{what} changed its input {name}; write only to the gradients.")
    rtol, atol = _tolerances(dtype)
    for name, value, want, like in zip(("dq", "dk", "dv"), found, expected, (q, k, v)):
        if not isinstance(value, torch.Tensor):
            raise GradingFailure(f"{what}: {name} should be a torch.Tensor, but is {describe(value)}.")
        if tuple(value.shape) != tuple(like.shape) or value.dtype != dtype or value.device != like.device:
            raise GradingFailure(f"{what}: {name} should be a {dtype} tensor of shape {tuple(like.shape)} on "
                                 f"{like.device}, but is {value.dtype} of shape {tuple(value.shape)} on {value.device}.")
        scale = max(1.0, float(np.abs(want).max()))       # gradients summed over many keys grow with n
        expect_close(value.detach().double().cpu().numpy(), want, what=f"{what}: {name}", rtol=rtol,
                     atol=atol * scale, hint=BWD_HINT)
    if follow and interpreting() and dtype == torch.float32:
        signs = _random_signs(k.shape)
        flipped = k64 * signs
        # P from the given log-sum-exp, or from one the kernels recompute over the keys they load.
        accepted = [ref.attention_backward(q64, flipped, v64, do64, causal, sm_scale, o=o64, lse=lse64),
                    ref.attention_backward(q64, flipped, v64, do64, causal, sm_scale, o=o64)]
        found = in_student_process(probes.backward_traced_call, flash_attention_backward, q, k, v, o, lse, do,
                                   causal, sm_scale, what, flip_k=signs)
        grads = [g.detach().double().cpu().numpy() if isinstance(g, torch.Tensor) else None for g in found]
        def close(g, w):
            return g is not None and g.shape == w.shape and np.allclose(g, w, rtol=rtol,
                                                                        atol=atol * max(1.0, np.abs(w).max()))

        _judge_follow(flash_attention_backward, what, "the gradients",
                      followed=any(all(close(g, w) for g, w in zip(grads, want)) for want in accepted),
                      unchanged=all(close(g, w) for g, w in zip(grads, expected)),
                      hint=f"a formula that only holds for some inputs. {BWD_HINT}")


def check_bwd_output(flash_attention_backward):
    """Non-causal, N a multiple of 32, every head dim 16-128, batch and heads; float16 too
    (the interpreter supports it), and bfloat16 on a GPU."""
    import torch

    device, _ = _device_and_dtype(None)
    for i, shape in enumerate([(1, 1, 1, 64, 16), (1, 2, 2, 64, 32), (2, 1, 1, 64, 64), (1, 1, 1, 32, 128)]):
        _check_bwd(flash_attention_backward, shape, seed=700 + i, follow=i == 0)
    _check_bwd(flash_attention_backward, (1, 2, 2, 64, 32), seed=750, dtype=torch.float16)
    if device == "cuda":
        _check_bwd(flash_attention_backward, (2, 2, 2, 128, 64), seed=751, dtype=torch.bfloat16)


def check_bwd_ragged_causal(flash_attention_backward):
    """N = 1, N smaller than a block, N not a multiple of any block, causal and not, diagonal included."""
    for i, (shape, causal) in enumerate([((1, 1, 1, 1, 16), False), ((1, 1, 1, 1, 32), True),
                                         ((1, 2, 2, 5, 16), False), ((2, 1, 1, 17, 32), True),
                                         ((1, 1, 1, 33, 64), True), ((1, 1, 1, 67, 16), False),
                                         ((1, 2, 2, 64, 32), True), ((1, 1, 1, 96, 16), True)]):
        _check_bwd(flash_attention_backward, shape, causal, seed=800 + i, follow=i == 3)


def check_bwd_scale(flash_attention_backward):
    """A custom sm_scale, and large scores (P must come from the log-sum-exp, not from exp(S))."""
    for i, (shape, causal, sm_scale, magnitude) in enumerate([
            ((1, 1, 1, 64, 32), False, 0.05, 1.0), ((1, 2, 2, 64, 16), True, 1.0, 1.0),
            ((1, 1, 1, 40, 64), False, 0.3, 1.0), ((1, 1, 1, 64, 16), False, None, 8.0),
            ((1, 1, 1, 48, 32), True, None, 6.0)]):
        _check_bwd(flash_attention_backward, shape, causal, sm_scale, seed=900 + i, magnitude=magnitude,
                   follow=i == 0)


def check_bwd_gqa(flash_attention_backward):
    """Grouped-query attention: k and v with 1 (multi-query) or H / 2 or H / 3 heads; dK and dV
    must add up the query heads of each group."""
    for i, (shape, causal) in enumerate([((1, 4, 2, 40, 16), False), ((2, 4, 1, 33, 32), True),
                                         ((1, 6, 3, 64, 16), True)]):
        _check_bwd(flash_attention_backward, shape, causal, seed=1000 + i, follow=i == 0)


def bwd_overhead_allowance(d, element_size):
    """Extra bytes per token that the backward launcher may add as N grows, beyond the
    gradients: a copy of q, k, v, o and do, a float32 dq buffer, and D and lse in float32."""
    return 5 * d * element_size + 4 * d + 8


def check_bwd_memory(flash_attention_backward):
    """Memory beyond dq, dk and dv at several N, by the rules of the forward kernel's check:
    tiles of a fixed size cost the same at every N, so the overhead may grow no faster than
    bwd_overhead_allowance per token, which a BLOCK x N strip of P or an N x N matrix exceeds."""
    import torch

    device, dtype = _device_and_dtype(None)
    d = 16 if device == "cpu" else 64
    sizes = (64, 128, 256) if device == "cpu" else (1024, 4096, 16384)
    element = torch.empty(0, dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(1100)
    overheads = []
    for n in sizes:
        q, k, v, do = (torch.randn(1, 1, n, d, generator=gen).to(dtype) for _ in range(4))
        o64, lse64 = ref.attention_with_lse(q.double().numpy(), k.double().numpy(), v.double().numpy())
        expected = ref.attention_backward(*(t.double().numpy() for t in (q, k, v, do)))
        o, lse = torch.from_numpy(o64).to(device=device, dtype=dtype), torch.from_numpy(lse64).float().to(device)
        q, k, v, do = (t.to(device) for t in (q, k, v, do))
        what = f"flash_attention_backward(q, k, v, o, lse, do with N={n}, D={d})"
        # A first call loads code and fills caches; its memory is not measured, so it also
        # records the store addresses (plain stores by several programs lose the cell).
        in_student_process(probes.backward_traced_call, flash_attention_backward, q, k, v, o, lse, do, False, None,
                           what)
        if device == "cuda":
            grads, peak = in_student_process(probes.cuda_backward_peak, flash_attention_backward, q, k, v, o, lse, do,
                                             what)
        else:
            grads, peak = traced_peak(probes.backward_traced_call, flash_attention_backward, q, k, v, o, lse, do,
                                      False, None, what, shared_stores=False)
        expect_sequence(grads, 3, what=what, names="(dq, dk, dv)")
        rtol, atol = _tolerances(dtype)
        for name, value, want in zip(("dq", "dk", "dv"), grads, expected):
            expect_close(value.detach().double().cpu().numpy(), want, what=f"{what}: {name}", rtol=rtol,
                         atol=atol * max(1.0, float(np.abs(want).max())), hint=BWD_HINT)
        overheads.append(peak - 3 * n * d * element)
        scores = n * n * element
        if peak > scores / 4 + n * d * element * 16 + 2**20:
            raise GradingFailure(f"{what}: peak memory {peak / 2**20:.2f} MiB is close to the {scores / 2**20:.2f} "
                                 "MiB of an N x N matrix. Recompute P tile by tile inside the kernels.")
    per_token = (overheads[-1] - overheads[0]) / (sizes[-1] - sizes[0])
    allowed = bwd_overhead_allowance(d, element)
    if per_token > allowed:
        raise GradingFailure(
            f"flash_attention_backward's memory beyond the gradients grew by {per_token:.0f} bytes per token from "
            f"N={sizes[0]} to N={sizes[-1]} (D={d}); at most {allowed} is allowed (copies of the inputs, D and a "
            f"float32 dq). The overheads were {', '.join(f'{o / 1024:.0f} KiB' for o in overheads)}. Kernels that "
            "loop over blocks hold tiles of a fixed size; a block that grows with N, or P built outside the "
            "kernels, makes memory grow with N.")


# ------------------------------------------------------------- split-K decoding

DECODE_HINT = ("Query head h reads key/value head h // (H_q // H_kv); only the first cache_lens[b] positions of "
               "sequence b count; each chunk stores its (m, l, o), and the merge weighs o_c by l_c * exp(m_c - m).")


def _check_decode(decode_attention, batch, heads, kv_heads, max_len, d, lens, sm_scale=None, *, seed, dtype=None,
                  follow=False):
    import torch

    device, dtype = _device_and_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, d, generator=gen).to(dtype)
    k_cache, v_cache = (torch.randn(batch, kv_heads, max_len, d, generator=gen).to(dtype) for _ in range(2))
    expected = ref.decode_attention(q.double().numpy(), k_cache.double().numpy(), v_cache.double().numpy(), lens,
                                    sm_scale)
    q, k_cache, v_cache = (t.to(device) for t in (q, k_cache, v_cache))
    cache_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    originals = [t.clone() for t in (q, k_cache, v_cache, cache_lens)]
    what = (f"decode_attention(q of shape {tuple(q.shape)}, caches of shape {tuple(k_cache.shape)}, cache_lens={lens}, "
            f"{dtype}" + (f", sm_scale={sm_scale}" if sm_scale is not None else "") + ")")
    out, launches = in_student_process(probes.decode_traced_call, decode_attention, q, k_cache, v_cache, cache_lens,
                                       sm_scale, what)
    for name, before, after in zip(("q", "k_cache", "v_cache", "cache_lens"), originals,
                                   (q, k_cache, v_cache, cache_lens)):
        if not torch.equal(before, after):
            raise GradingFailure(f"{what} changed its input {name}; write only to new buffers.")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape) or out.dtype != dtype:
        raise GradingFailure(f"{what} should return a {dtype} tensor of shape {tuple(q.shape)}, but returned "
                             f"{describe(out) if not isinstance(out, torch.Tensor) else f'{out.dtype} {tuple(out.shape)}'}.")
    rtol, atol = _tolerances(dtype)
    expect_close(out.detach().double().cpu().numpy(), expected, what=what, rtol=rtol, atol=atol, hint=DECODE_HINT)
    if follow and interpreting() and dtype == torch.float32:
        signs = _random_signs(k_cache.shape)
        want = ref.decode_attention(q.double().numpy(), k_cache.double().numpy() * signs, v_cache.double().numpy(),
                                    lens, sm_scale)
        out, _ = in_student_process(probes.decode_traced_call, decode_attention, q, k_cache, v_cache, cache_lens,
                                    sm_scale, what, flip_k=signs)
        found = out.detach().double().cpu().numpy() if isinstance(out, torch.Tensor) else None
        def close(w):
            return found is not None and found.shape == w.shape and np.allclose(found, w, rtol=rtol, atol=atol)

        _judge_follow(decode_attention, what, "the output", followed=close(want), unchanged=close(expected),
                      hint=DECODE_HINT)
    return launches


def check_decode_output(decode_attention):
    """Caches of 1 to 300 positions with per-sequence lengths (1, full, ragged), query groups of 1
    (multi-head), 2, 4 and 8 (multi-query), head dims 16-128, a custom sm_scale; float16 too."""
    import torch

    device, _ = _device_and_dtype(None)
    for i, (batch, heads, kv_heads, max_len, d, lens, scale) in enumerate([
            (1, 1, 1, 1, 16, [1], None), (2, 2, 2, 40, 32, [40, 7], None), (3, 4, 2, 100, 64, [1, 100, 65], None),
            (1, 8, 1, 300, 16, [257], 0.5), (2, 4, 4, 64, 128, [64, 33], None), (2, 6, 3, 130, 32, [129, 2], 0.1)]):
        _check_decode(decode_attention, batch, heads, kv_heads, max_len, d, lens, scale, seed=1200 + i, follow=i == 2)
    _check_decode(decode_attention, 2, 4, 2, 96, 32, [96, 50], seed=1250, dtype=torch.float16)
    if device == "cuda":
        _check_decode(decode_attention, 2, 8, 2, 4096, 128, [4096, 1000], seed=1251, dtype=torch.bfloat16)


def check_decode_split(decode_attention):
    """A long cache (2048 and 1500 positions) for 2 sequences of 4 query heads: the launch that
    reads the cache and reduces it must have more programs than (sequence, query head) pairs.
    Under the interpreter that launch is found by its bytes: it loads at least a quarter of the
    valid cache and stores less than a quarter of what it loads (a copy or a cast of the cache
    stores as much as it loads, and does not count); on a GPU, the largest grid must be split."""
    import torch

    batch, heads, kv_heads, max_len, d, lens = 2, 4, 2, 2048, 64, [2048, 1500]
    launches = _check_decode(decode_attention, batch, heads, kv_heads, max_len, d, lens, seed=1300)
    advice = ("one program then reads a whole cache alone while the rest of the GPU idles. Split the cache into "
              "chunks, one program per (chunk, sequence, head), then merge the chunks' partial states.")
    if launches and launches[0][1] is not None:
        _, dtype = _device_and_dtype(None)
        cache = 2 * sum(lens) * kv_heads * d * torch.empty(0, dtype=dtype).element_size()
        reading = [(p, ld, st) for p, ld, st in launches if 4 * ld >= cache and 4 * st < ld]
        if not reading:
            raise GradingFailure(
                f"decode_attention on caches of {lens} positions: no kernel launch read the cache and reduced it "
                f"(launches as (programs, bytes loaded, bytes stored): {launches}; the valid cache holds {cache} "
                "bytes). The attention over the cache must run in your kernels.")
        small = [p for p, _, _ in reading if p <= batch * heads]
        if small:
            raise GradingFailure(
                f"decode_attention on caches of {lens} positions: the kernel that reads the cache ran {small[0]} "
                f"programs, no more than one per (sequence, query head) ({batch * heads}): " + advice)
        return
    grids = [p for p, _, _ in launches]
    if not grids or max(grids) <= batch * heads:
        raise GradingFailure(
            f"decode_attention on a cache of {max_len} positions launched grids of {grids} programs, never more than "
            f"one program per (sequence, query head) ({batch * heads}): " + advice)
