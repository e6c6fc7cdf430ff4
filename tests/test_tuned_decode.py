"""The tuned decoding step (autograde.tuned_decode) computes what the exercise's
decode_attention computes: within autograde.bounds' rounding-error bound of the
float64 reference for ragged lengths, query groups of 1 to 16, head widths 16 to
128, custom scales, caches that are windows of longer buffers or in the
(B, L, H, D) layout, float16; split and unsplit. It passes the hidden checks
that grade Exercise 5 (outputs, the cache read in place, the split, the compile
report). Its split count follows FlashAttention-2's rule; its kernels compile for
an A100 and an H100 without spills. Kernels run in Triton's interpreter here,
natively on a GPU. Imports nothing that needs nbformat or scripts/env.sh."""
import math

import numpy as np
import pytest
import torch

from autograde import tuned_decode as td
from autograde.bounds import decode_bounds
from autograde.reference import flash as ref
from coursekit.triton_env import triton_device

DEVICE = triton_device(quiet=True)
NATIVE = DEVICE == "cuda"


def _caches(batch, heads, kv_heads, max_len, d, dtype, seed, layout):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, d, generator=gen).to(dtype)
    if layout == "window":            # the first max_len positions of buffers of 2 max_len + 3
        k, v = (torch.randn(batch, kv_heads, 2 * max_len + 3, d, generator=gen).to(dtype)[:, :, :max_len]
                for _ in range(2))
    elif layout == "heads_inner":     # (B, L, H_kv, D) storage seen as (B, H_kv, L, D)
        k, v = (torch.randn(batch, max_len, kv_heads, d, generator=gen).to(dtype).transpose(1, 2) for _ in range(2))
    else:
        k, v = (torch.randn(batch, kv_heads, max_len, d, generator=gen).to(dtype) for _ in range(2))
    return q, k, v


def _assert_within_bound(out, q, k, v, lens, sm_scale=None):
    arrays = [t.double().cpu().numpy() for t in (q, k, v)]
    want = ref.decode_attention(*arrays, lens, sm_scale)
    bound = decode_bounds(*arrays, lens, sm_scale, q.dtype, NATIVE)
    assert out.shape == q.shape and out.dtype == q.dtype, (out.shape, out.dtype)
    error = np.abs(out.double().cpu().numpy() - want)
    worst = np.unravel_index(np.argmax(error / bound), error.shape)
    assert np.all(error <= bound), f"error {error[worst]:.3g} at {worst}, bound {bound[worst]:.3g}"


@pytest.mark.parametrize("batch, heads, kv_heads, max_len, d, lens, sms, dtype, layout, scale", [
    (1, 1, 1, 1, 16, [1], None, torch.float32, "contiguous", None),
    (2, 4, 2, 300, 32, [300, 7], None, torch.float32, "window", None),
    (3, 6, 3, 130, 40, [1, 130, 65], None, torch.float32, "heads_inner", 0.3),
    (2, 16, 1, 257, 64, [257, 128], None, torch.float32, "contiguous", None),    # a group of 16 (the most)
    (2, 8, 2, 1000, 128, [999, 1000], None, torch.float32, "window", None),
    (2, 4, 4, 256, 80, [256, 100], 1, torch.float32, "contiguous", None),        # 8 programs, 2 slots: no split
    (1, 4, 2, 700, 64, [700], 3, torch.float32, "heads_inner", None),       # 2 programs on 6 slots: 3 splits
    (2, 8, 2, 96, 32, [96, 50], None, torch.float16, "contiguous", None),
    (1, 32, 8, 2048, 128, [2048], None, torch.float16, "window", None),
])
def test_tuned_decode_matches_the_reference(batch, heads, kv_heads, max_len, d, lens, sms, dtype, layout, scale):
    q, k, v = _caches(batch, heads, kv_heads, max_len, d, dtype, max_len + d + heads, layout)
    out = td.tuned_decode(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.tensor(lens), sm_scale=scale, sms=sms)
    _assert_within_bound(out, q, k, v, lens, scale)


def test_a_query_read_through_its_strides():
    """q as every other head of a wider buffer: its head stride is not d."""
    q, k, v = _caches(2, 8, 2, 200, 32, torch.float32, 11, "contiguous")
    wide = torch.zeros(2, 16, 32)
    wide[:, ::2] = q
    out = td.tuned_decode(wide[:, ::2].to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.tensor([200, 60]))
    _assert_within_bound(out, q, k, v, [200, 60])


class _Grids:
    """Wraps a kernel: records each launch's grid."""
    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def test_splits_are_cut_from_the_longest_sequence_not_the_allocation(monkeypatch):
    """A cache allocated for 4096 positions holding 300 and 100: the splits cover the 300
    (3 blocks of 128 keys at d = 32), not 4096; with max_seqlen below a length the last
    split reads on, and the output stays right."""
    grids = _Grids(td._split_kernel)
    monkeypatch.setattr(td, "_split_kernel", grids)
    q, k, v = _caches(1, 4, 2, 4096, 32, torch.float32, 5, "contiguous")
    out = td.tuned_decode(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.tensor([300]))
    _assert_within_bound(out, q, k, v, [300])
    assert 1 < grids.grids[-1][0] <= 3, grids.grids
    out = td.tuned_decode(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.tensor([300]).to(DEVICE), max_seqlen=64)
    assert grids.grids[-1][0] == 1, grids.grids
    _assert_within_bound(out, q, k, v, [300])
    out = td.tuned_decode(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.tensor([2**32 + 5]))  # past the cache
    _assert_within_bound(out, q, k, v, [4096])


def test_large_scores_and_extreme_lengths():
    """Scores in the hundreds (the maximum of every split, then of the merge, must be
    subtracted), a length of 1 beside a full one, and a length past the cache, which
    reads the whole cache and no further."""
    q, k, v = _caches(3, 4, 2, 500, 32, torch.float32, 7, "contiguous")
    q, k = 12 * q, 12 * k
    out = td.tuned_decode(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.tensor([1, 500, 10_000]))
    _assert_within_bound(out, q, k, v, [1, 500, 500])


def test_one_split_needs_no_merge(monkeypatch):
    """Where the (sequence, key-value head) programs fill the multiprocessors, the split
    kernel normalises its output itself: no partial states and no merge launch."""
    def no_merge(*args, **kwargs):
        raise AssertionError("merge launched for a single split")

    monkeypatch.setattr(td, "_merge_kernel", type("NoMerge", (), {"__getitem__": lambda self, grid: no_merge})())
    q, k, v = _caches(2, 4, 2, 300, 32, torch.float32, 3, "contiguous")
    out = td.tuned_decode(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.tensor([300, 5]), sms=2)
    _assert_within_bound(out, q, k, v, [300, 5])
    with pytest.raises(AssertionError, match="merge launched"):
        td.tuned_decode(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.tensor([300, 5]), sms=132)


def _efficiency(programs, splits, sms):
    waves = programs * splits / sms
    return waves / math.ceil(waves)


def test_split_count_follows_flash_attention_2():
    # The example in FlashAttention's source comment: 48 (batch x heads) programs on
    # 108 slots take 2 splits (efficiency 0.89), not 3 (0.67).
    assert td.split_count(48, 64, 108) == 2
    # Programs that fill 80% of the multiprocessors are not split; fewer are.
    assert td.split_count(106, 512, 132) == 1 and td.split_count(105, 512, 132) > 1
    for programs in (1, 2, 8, 16, 48, 64, 100):
        for blocks in (1, 3, 16, 512, 2048):
            splits = td.split_count(programs, blocks, 132)
            assert 1 <= splits <= max(1, min(blocks, td.MAX_SPLITS))
            if programs < td.FILLED * 132:
                # counts that give each split fewer blocks than one split fewer does (FA2's "eligible")
                eligible = [s for s in range(1, min(blocks, td.MAX_SPLITS) + 1)
                            if s == 1 or math.ceil(blocks / s) < math.ceil(blocks / (s - 1))]
                assert splits in eligible
                best = max(_efficiency(programs, s, 132) for s in eligible)
                assert _efficiency(programs, splits, 132) >= td.NEAR_BEST * best - 1e-12
                # the fewest such: every eligible count below it is further from the best
                assert all(_efficiency(programs, s, 132) < td.NEAR_BEST * best for s in eligible if s < splits)


@pytest.mark.parametrize("check", ["check_decode_output", "check_decode_in_place", "check_decode_split",
                                   "check_decode_compiles"])
def test_tuned_decode_passes_the_exercises_hidden_checks(check):
    from autograde.checks import flash

    getattr(flash, check)(td.tuned_decode)


@pytest.mark.parametrize("args, message", [
    (((2, 4, 16), (2, 3, 40, 16), (2, 3, 40, 16), (2,)), "multiple of the 3 key-value heads"),
    (((2, 4, 16), (2, 2, 40, 8), (2, 2, 40, 8), (2,)), "do not match"),
    (((2, 4, 256), (2, 2, 40, 256), (2, 2, 40, 256), (2,)), "up to 128"),
    (((2, 34, 16), (2, 2, 40, 16), (2, 2, 40, 16), (2,)), "at most 16"),
    (((2, 4), (2, 2, 40, 16), (2, 2, 40, 16), (2,)), "q must be"),
    (((2, 4, 16), (2, 2, 0, 16), (2, 2, 0, 16), (2,)), "caches of 0 positions"),
])
def test_tuned_decode_names_what_it_cannot_read(args, message):
    shapes = [torch.zeros(s) for s in args]
    with pytest.raises(ValueError, match=message):
        td.tuned_decode(*shapes)


def test_tuned_decode_refuses_offsets_past_32_bits():
    """A cache whose positions lie 2**31 elements apart (meta tensors: nothing is allocated)."""
    q = torch.empty(1, 1, 16, device="meta")
    cache = torch.empty_strided((1, 1, 2, 16), (2**32, 2**32, 2**31, 1), device="meta")
    with pytest.raises(ValueError, match="2\\*\\*31"):
        td.tuned_decode(q, cache, cache, torch.ones(1, dtype=torch.int32))


def test_every_configuration_compiles_without_spills_with_tensor_cores():
    from coursekit.compile_worker import backend_problem
    from coursekit.compile_report import compile_reports, render

    problem = backend_problem()
    if problem is not None:
        pytest.skip(problem)
    reports = compile_reports(td.screened_launches(), targets=("A100", "H100"), workers=2)
    bad = [f"{r.kernel} [{r.spec.label()}] on {t.target}: {t.problem() or 'spills'}"
           for r in reports for t in r.targets if not t.compiles or t.spills or t.problem()]
    assert not bad, "\n".join(bad) + "\n" + render(reports)
    split = [r for r in reports if r.kernel == "_split_kernel"]
    # q k^T and p v on the tensor cores of both (16-row tiles: HMMA; warpgroup MMA needs 64 rows)
    assert split and all(r[t].mma.get("HMMA", 0) > 0 for r in split for t in ("A100", "H100")), render(reports)
