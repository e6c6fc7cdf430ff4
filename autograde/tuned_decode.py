"""A tuned split-K decoding step, beside the instructor's answer to Chapter 4's
Exercise 5 as autograde.tuned_backward is beside the answer to Exercise 4. It
answers that exercise too, so it lives here, in the instructor's package, and
never ships to students: bookutils.benchmark times it where this package is
present and leaves its row out elsewhere.

What it changes against the exercise's answer (one program per (chunk of 64
positions, sequence, query head), then a merge over every chunk):

- one program per (split, sequence, key-value head) reads its keys and values
  once for all the query heads that share them (grouped-query attention): the
  group's queries are the rows of one tile, padded to 16 rows so that q k^T and
  p v are tensor-core products. The exercise's answer reads each cache position
  once per query head, four times over for Mistral's 32 query heads on 8.
- the number of splits is chosen from the batch, the key-value heads, the
  longest sequence and the GPU's multiprocessors (split_count): no split at all
  when the (sequence, key-value head) programs already fill 80% of the
  program slots (two 4-warp programs per multiprocessor, as FlashAttention-2
  counts them), otherwise the fewest splits whose last wave of programs keeps
  the slots nearly as busy as the best count would (the rule of
  FlashAttention-2's num_splits_heuristic). A step with one split normalises its
  output in the same launch and needs no merge; the exercise's answer always has
  max_len / 64 chunks and merges them all.
- exp2 with log2(e) folded into the scale, as in the tuned forward.
- the caches are read in place through their batch, head and position strides,
  as in the exercise; offsets within one (sequence, key-value head) are 32-bit,
  so tuned_decode refuses caches whose offsets there reach 2**31.

Lengths: cache_lens[b] positions of sequence b are read, at least 1 (an empty
cache has no attention: its output is 0/0, NaN) and at most the caches' length
(a larger one reads the whole cache and no further). The splits are cut from the
longest sequence: max_seqlen when given, else cache_lens' largest when cache_lens
is on the CPU (as a serving loop keeps it), else the caches' allocated length,
so that a cache allocated far longer than its sequences is not split into
splits that have nothing to read.

Configurations (BLOCK_N keys per step, warps, stages) per head width, SPLIT_CONFIGS,
were checked with the compile report (`python -m autograde.tuned_decode`, and
tests/test_tuned_decode.py, which fails on a spill). With Triton 3.9's compiler,
float16 (groups of 1, 4, 8 and 16) and bfloat16 (a group of 4), split or direct: 128 keys at d = 64 and 64
keys at d = 128, 4 warps, 3 stages, 86-104 registers, no spills, 70-71 KiB of
shared memory (two K and V tiles in flight, 64 KiB, and scratch), which limits a
multiprocessor to 8 (A100) or 12 (H100) of its 64 warps; q k^T and p v are HMMA on both (the
group's 16-row tile is below the 64 rows of Hopper's warpgroup MMA). The merge:
32-48 registers. Under
Triton's interpreter (no GPU) there is no multiprocessor count: tuned_decode
then assumes an H100's 132, so that small tests split. None of this has been
timed on a GPU yet: `./scripts/benchmark --save` does, where one is lent."""
import math

import torch

from coursekit.triton_env import triton_device

DEVICE = triton_device(quiet=True)   # must come before any @triton.jit below

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bookutils.flash_tuned import _attend  # noqa: E402

LOG2_E = 1.4426950408889634
MAX_HEAD = 128
MAX_GROUP = 16                       # query heads per key-value head: the rows of one tile (Llama 3 405B has 16: 128 on 8)
MAX_SPLITS = 128                     # FlashAttention-2's bound (the most its merge kernel takes)
INT32_LIMIT = 2**31
GRID_AXIS_1 = 65_535                 # CUDA's limit on grid axis 1 (sequences x key-value heads)
INTERPRETER_SMS = 132                # an H100 SXM's (and the H200's) multiprocessors
PROGRAMS_PER_SM = 2                  # program slots of a multiprocessor, as FlashAttention-2 counts 128-thread ones
FILLED = 0.8                         # programs / slots above which no split pays
NEAR_BEST = 0.85                     # a split count whose wave efficiency is within this of the best
MERGE_BLOCK = 16                     # partial states merged per step

# (BLOCK_N, num_warps, num_stages) per head width: a step reads BLOCK_N keys and
# values; chosen with the compile report (see tests/test_tuned_decode.py).
SPLIT_CONFIGS = {64: (128, 4, 3), 128: (64, 4, 3)}


def split_config(head):
    return SPLIT_CONFIGS[64] if head <= 64 else SPLIT_CONFIGS[128]


def split_count(programs, key_blocks, slots, max_splits=MAX_SPLITS):
    """How many splits of the cache, for `programs` (sequence, key-value head) pairs over
    `key_blocks` blocks of keys, with `slots` programs running at once on the GPU: a wave
    is `slots` programs, and a split count's efficiency is the mean occupancy of its
    waves (waves / ceil(waves))."""
    if programs >= FILLED * slots:
        return 1
    max_splits = max(1, min(max_splits, slots, key_blocks))
    efficiency = {}
    for splits in range(1, max_splits + 1):
        # A count that gives every split as many blocks as one split fewer does is no better.
        if splits > 1 and -(-key_blocks // splits) == -(-key_blocks // (splits - 1)):
            continue
        waves = programs * splits / slots
        efficiency[splits] = waves / math.ceil(waves)
    best = max(efficiency.values())
    return min(s for s, e in efficiency.items() if e >= NEAR_BEST * best)


@triton.jit
def _split_kernel(Q, K, V, LENS, M_PART, L_PART, O_PART, OUT, heads, kv_heads, d, splits, split_len,
                  qk_scale, stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                  stride_ob, stride_oh, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD: tl.constexpr, DIRECT: tl.constexpr):
    """Keys [split * split_len, min(that + split_len, length)) of one (sequence,
    key-value head) (the last split: to the sequence's length), for the GROUP query heads that share them (rows of one tile).
    DIRECT (one split): the normalised output; otherwise the partial state in base 2
    (running maximum m, sum l, unnormalised output) of every query head."""
    split = tl.program_id(0)
    bhk = tl.program_id(1).to(tl.int64)          # int64: a head's offset may pass 2**31; within it, 32-bit
    b, hk = bhk // kv_heads, bhk % kv_heads
    length = tl.load(LENS + b)                   # clamped to the caches' length by tuned_decode
    lo = split * split_len
    # The last split reads on to the sequence's end: a max_seqlen below a length costs speed, not keys.
    hi = tl.where(split == splits - 1, length, tl.minimum(lo + split_len, length))
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD)
    head_rows = hk * GROUP + rows                # this group's query heads
    q_mask = (rows[:, None] < GROUP) & (dims[None, :] < d)
    q = tl.load(Q + b * stride_qb + head_rows[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    k_head = K + b * stride_kb + hk * stride_kh
    v_head = V + b * stride_vb + hk * stride_vh
    m = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
    l = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, HEAD), dtype=tl.float32)
    # The tuned forward's online softmax over keys [lo, hi), with keys masked at hi (n = hi).
    acc, l, m = _attend(acc, l, m, q, k_head, v_head, stride_kn, stride_vn, rows, dims, hi, d, lo, hi, qk_scale,
                        BLOCK_N, True, False, False)
    if DIRECT:
        out = acc / l[:, None]
        tl.store(OUT + b * stride_ob + head_rows[:, None] * stride_oh + dims[None, :],
                 out.to(OUT.dtype.element_ty), mask=q_mask)
    else:
        # A split past this sequence's length stores m = -inf, l = 0, acc = 0: weight 0 in the merge.
        state = (b * heads + head_rows) * splits + split
        tl.store(M_PART + state, m, mask=rows < GROUP)
        tl.store(L_PART + state, l, mask=rows < GROUP)
        tl.store(O_PART + state[:, None] * HEAD + dims[None, :], acc, mask=q_mask)


@triton.jit
def _merge_kernel(M_PART, L_PART, O_PART, OUT, heads, d, splits, stride_ob, stride_oh,
                  SPLITS_PAD: tl.constexpr, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    """One (sequence, query head): the partial states of its splits, each weighted by
    2^(m_i - max m), summed in blocks of BLOCK splits."""
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // heads, bh % heads
    every = tl.arange(0, SPLITS_PAD)
    top = tl.max(tl.load(M_PART + bh * splits + every, mask=every < splits, other=float("-inf")), axis=0)
    dims = tl.arange(0, HEAD)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    acc = tl.zeros((BLOCK, HEAD), dtype=tl.float32)
    for start in range(0, splits, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        m = tl.load(M_PART + bh * splits + idx, mask=idx < splits, other=float("-inf"))
        weight = tl.math.exp2(m - top)               # 0 for an empty split (m = -inf)
        total += weight * tl.load(L_PART + bh * splits + idx, mask=idx < splits, other=0.0)
        o = tl.load(O_PART + (bh * splits + idx)[:, None] * HEAD + dims[None, :], mask=idx[:, None] < splits,
                    other=0.0)
        acc += weight[:, None] * o
    out = tl.sum(acc, axis=0) / tl.sum(total, axis=0)
    tl.store(OUT + b * stride_ob + h * stride_oh + dims, out.to(OUT.dtype.element_ty), mask=dims < d)


def _check(q, k_cache, v_cache, cache_lens):
    """(batch, heads, kv_heads, max_len, d), or a ValueError naming what the kernel cannot read."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k_cache, v_cache, cache_lens)):
        raise ValueError("tuned_decode: q, k_cache, v_cache and cache_lens must be tensors")
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"tuned_decode: q must be (B, H, D) and the caches (B, H_kv, L_max, D), got q "
                         f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    batch, heads, d = q.shape
    _, kv_heads, max_len, _ = k_cache.shape
    if k_cache.shape[0] != batch or k_cache.shape[3] != d or tuple(cache_lens.shape) != (batch,):
        raise ValueError(f"tuned_decode: caches {tuple(k_cache.shape)} and cache_lens {tuple(cache_lens.shape)} do "
                         f"not match q {tuple(q.shape)}")
    if kv_heads == 0 or heads % kv_heads or heads // kv_heads > MAX_GROUP:
        raise ValueError(f"tuned_decode: {heads} query heads must be a multiple of the {kv_heads} key-value heads, "
                         f"at most {MAX_GROUP} per key-value head")
    if d > MAX_HEAD:
        raise ValueError(f"tuned_decode supports head dimensions up to {MAX_HEAD}, got {d}")
    if len({q.dtype, k_cache.dtype, v_cache.dtype}) != 1 or len({q.device, k_cache.device, v_cache.device}) != 1:
        raise ValueError("tuned_decode: q and the caches must share one dtype and one device")
    if batch * kv_heads > GRID_AXIS_1:
        raise ValueError(f"tuned_decode: batch * key-value heads exceed CUDA's {GRID_AXIS_1:,} programs on axis 1")
    return batch, heads, kv_heads, max_len, d


def multiprocessors(device):
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SMS


def tuned_decode(q, k_cache, v_cache, cache_lens, sm_scale=None, sms=None, max_seqlen=None):
    """One new query per sequence, q (B, H_q, D), against the first cache_lens[b]
    positions of caches (B, H_kv, L_max, D), read in place; query head h reads
    key-value head h // (H_q / H_kv). The interface of the exercise's
    decode_attention; `sms` overrides the multiprocessor count, `max_seqlen` the
    length the splits are cut from (the longest cache_lens[b]; a smaller one is
    slower, not wrong)."""
    batch, heads, kv_heads, max_len, d = _check(q, k_cache, v_cache, cache_lens)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache, v_cache = (c if c.stride(-1) == 1 else c.contiguous() for c in (k_cache, v_cache))
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if (max_len - 1) * c.stride(2) + d - 1 >= INT32_LIMIT:
            raise ValueError(f"tuned_decode: offsets within a head of {name} reach past 2**31 (32-bit offsets)")
    if max_len == 0 or max_len >= INT32_LIMIT // 2:   # lo + split_len must stay a 32-bit sum
        raise ValueError(f"tuned_decode: caches of {max_len:,} positions (from 1 to 2**30 - 1)")
    out = torch.empty((batch, heads, d), device=q.device, dtype=q.dtype)
    if batch * heads == 0:
        return out
    if max_seqlen is None:
        max_seqlen = int(cache_lens.max()) if cache_lens.device.type == "cpu" and batch else max_len
    longest = max(1, min(max_len, int(max_seqlen)))
    # clamped before the 32-bit cast: a length of 2**32 + 5 must not read 5 positions
    lens = cache_lens.to(q.device).clamp(max=max_len).to(torch.int32)
    group = heads // kv_heads
    head = max(16, triton.next_power_of_2(d))
    block_n, warps, stages = split_config(head)
    key_blocks = triton.cdiv(longest, block_n)
    splits = split_count(batch * kv_heads, key_blocks, PROGRAMS_PER_SM * (sms or multiprocessors(q.device)))
    split_len = triton.cdiv(key_blocks, splits) * block_n
    splits = triton.cdiv(longest, split_len)      # no split left without keys of the longest sequence
    direct = splits == 1
    states = 1 if direct else batch * heads * splits
    m_part, l_part = (torch.empty(states, device=q.device, dtype=torch.float32) for _ in range(2))
    o_part = torch.empty((states, 1 if direct else head), device=q.device, dtype=torch.float32)
    _split_kernel[(splits, batch * kv_heads)](
        q, k_cache, v_cache, lens, m_part, l_part, o_part, out, heads, kv_heads, d, splits, split_len,
        scale * LOG2_E, *q.stride()[:2], *k_cache.stride()[:3], *v_cache.stride()[:3], *out.stride()[:2],
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, HEAD=head, DIRECT=direct,
        num_warps=warps, num_stages=stages)
    if not direct:
        _merge_kernel[(batch * heads,)](m_part, l_part, o_part, out, heads, d, splits, *out.stride()[:2],
                                        SPLITS_PAD=triton.next_power_of_2(splits), BLOCK=MERGE_BLOCK, HEAD=head)
    return out


def launches(heads=(64, 128), groups=(1, 4, 8, MAX_GROUP), max_len=32768, batch=1, kv_heads=8, dtype=torch.float16):
    """coursekit.compile_report Launches of both kernels as tuned_decode makes them for
    each head width and group size, split, on an H100's 132 multiprocessors, and
    direct; nothing runs."""
    from coursekit.compile_report import Launch, specialise

    out = []
    for head in heads:
        block_n, warps, stages = split_config(head)
        for group in groups:
            q = torch.empty(batch, kv_heads * group, head, dtype=dtype)
            cache = torch.empty(batch, kv_heads, max_len, head, dtype=dtype)
            lens = torch.empty(batch, dtype=torch.int32)
            stats = torch.empty(batch * kv_heads * group * 8)
            for direct in (False, True):
                spec = specialise(_split_kernel, q, cache, cache, lens, stats, stats, stats, q, kv_heads * group,
                                  kv_heads, head, 8, max_len // 8, 1.0, *q.stride()[:2],
                                  *cache.stride()[:3], *cache.stride()[:3], *q.stride()[:2], GROUP=group,
                                  GROUP_PAD=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, HEAD=head,
                                  DIRECT=direct, num_warps=warps, num_stages=stages)
                out.append(Launch(_split_kernel, spec))
        q = torch.empty(batch, kv_heads, head, dtype=dtype)
        stats = torch.empty(batch * kv_heads * MAX_SPLITS)
        spec = specialise(_merge_kernel, stats, stats, stats, q, kv_heads, head, MAX_SPLITS, *q.stride()[:2],
                          SPLITS_PAD=MAX_SPLITS, BLOCK=MERGE_BLOCK, HEAD=head)
        out.append(Launch(_merge_kernel, spec))
    return out


def screened_launches():
    """What the compile report checks (tests/test_tuned_decode.py): launches() in float16,
    and a group of 4 in bfloat16."""
    return launches() + launches(groups=(4,), dtype=torch.bfloat16)


if __name__ == "__main__":
    from coursekit.compile_report import compile_reports, render

    print(render(compile_reports(screened_launches(), targets=("A100", "H100"))))
