"""The tuned forward kernel (bookutils.flash_tuned) computes what the teaching
kernel computes: the same output and natural-log log-sum-exp as the float64
reference, in float16, for ragged lengths, causal or not, head dimensions from
16 to 128, and inputs in any layout with unit last stride; its log-sum-exp
feeds the instructor's backward kernels; it autotunes over one configuration
under the interpreter. Its launcher refuses what the kernel cannot read: K and V
that differ from Q, too many heads for the grid, offsets within a head past 32
bits. Kernels run in Triton's interpreter here, natively on a GPU."""
import pytest
import torch

from bookutils.flash_tuned import CONFIGS, INTERPRETER_CONFIG, _tuned_forward_kernel, flash_forward_tuned
from coursekit.triton_env import triton_device
from coursekit.triton_trace import interpreting

from tests.kernel_bounds import assert_forward_within_bounds

DEVICE = triton_device(quiet=True)


@pytest.mark.parametrize("n, d, causal", [(1, 16, True), (45, 16, False), (45, 16, True), (64, 64, True),
                                          (100, 24, True), (97, 80, False), (130, 128, True), (128, 128, False)])
def test_tuned_kernel_matches_the_reference_in_float16(n, d, causal):
    gen = torch.Generator().manual_seed(n * d)
    q, k, v = (torch.randn(2, 2, n, d, generator=gen).half().to(DEVICE) for _ in range(3))
    out, lse = flash_forward_tuned(q, k, v, causal=causal)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert_forward_within_bounds(out, lse, q, k, v, causal)


def test_tuned_kernel_takes_a_custom_scale_and_strided_inputs():
    x = torch.randn(2, 70, 3, 32).to(DEVICE)      # (batch, n, heads, d) viewed as (batch, heads, n, d)
    q = k = v = x.transpose(1, 2)
    out, lse = flash_forward_tuned(q, k, v, causal=True, sm_scale=0.3)
    assert_forward_within_bounds(out, lse, q, k, v, True, 0.3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sm_scale", [-0.3, 0.0])
def test_tuned_kernel_takes_a_negative_or_zero_scale(sm_scale, causal):
    """softmax(scale * s) for scale <= 0: the row maximum is then taken of the
    scaled scores (the largest raw score is the smallest scaled one), and masked
    entries stay at -inf instead of turning into +inf."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 45, 16, generator=gen).to(DEVICE) for _ in range(3))
    out, lse = flash_forward_tuned(q, k, v, causal=causal, sm_scale=sm_scale)
    assert_forward_within_bounds(out, lse, q, k, v, causal, sm_scale)


@pytest.mark.parametrize("block_m, block_n, warps, stages", CONFIGS)
@pytest.mark.parametrize("n, d, causal", [(256, 64, True), (256, 64, False), (200, 40, True), (200, 40, False)])
def test_every_gpu_configuration_computes_attention(block_m, block_n, warps, stages, n, d, causal):
    """The configurations autotuning picks from on a GPU, each run in the
    interpreter (the kernel below the autotuner, its heuristics kept): lengths
    that are and are not a multiple of the block, head widths that fill the
    block's columns and that do not, causal or not."""
    from bookutils.flash_tuned import LOG2_E

    gen = torch.Generator().manual_seed(n + d)
    q, k, v = (torch.randn(1, 2, n, d, generator=gen).half().to(DEVICE) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(1, 2, n, device=DEVICE, dtype=torch.float32)
    head = max(16, 1 << (d - 1).bit_length())
    grid = (-(-n // block_m), 2)
    _tuned_forward_kernel.fn[grid](q, k, v, o, lse, n, d, 2, LOG2_E / d ** 0.5,
                                   *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                                   HEAD=head, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n,
                                   num_warps=warps, num_stages=stages)
    assert_forward_within_bounds(o, lse, q, k, v, causal)


def test_tuned_kernel_refuses_heads_wider_than_128():
    x = torch.zeros(1, 1, 4, 129, device=DEVICE)
    with pytest.raises(ValueError, match="up to 128"):
        flash_forward_tuned(x, x, x)


@pytest.mark.parametrize("k_shape, dtype, match", [((1, 1, 128, 32), torch.float32, "same"),
                                                    ((1, 1, 32, 32), torch.float32, "same"),
                                                    ((1, 1, 64, 32), torch.float16, "one dtype")])
def test_tuned_launcher_refuses_keys_and_values_that_do_not_match_the_queries(k_shape, dtype, match):
    """As flash_forward does: the kernel takes n and d from q alone, so a longer K/V
    would be silently cut and a shorter one read past its end."""
    q = torch.randn(1, 1, 64, 32).to(DEVICE)
    kv = torch.randn(*k_shape).to(dtype).to(DEVICE)
    with pytest.raises(ValueError, match=match):
        flash_forward_tuned(q, kv, kv)


def test_tuned_launcher_refuses_more_heads_than_grid_axis_1_holds():
    x = torch.zeros(1, 1, 4, 16, device=DEVICE).expand(2, 32_768, 4, 16)    # 65,536 (batch, head) pairs
    with pytest.raises(ValueError, match="65,535"):
        flash_forward_tuned(x, x, x)


@pytest.mark.parametrize("n, stride_n", [(524_289, 32 * 128), (2**24 + 1, 128)])
def test_tuned_launcher_refuses_offsets_within_a_head_past_32_bits(n, stride_n):
    """The tuned kernel's offsets within a head are 32-bit (row * stride_n): in a
    (batch, n, heads, d) layout with 32 heads of 128 the last row's offset passes
    2**31 from n = 524,289 on; in a contiguous one, from n = 2**24 + 1.
    Tensors on the meta device: shapes and strides, no memory."""
    x = torch.empty_strided((1, 32, n, 128), (n * stride_n, 128, stride_n, 1), dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="32-bit offsets"):
        flash_forward_tuned(x, x, x)


def test_autotuning_has_one_configuration_in_the_interpreter_and_all_on_a_gpu():
    configs = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
               for c in _tuned_forward_kernel.configs]
    assert configs == ([INTERPRETER_CONFIG] if interpreting() else list(CONFIGS))
    # every configuration's diagonal band is whole key blocks
    assert all(m % n == 0 for m, n, _, _ in CONFIGS + (INTERPRETER_CONFIG,))


def test_instructors_backward_accepts_the_tuned_forward():
    from autograde.solution_kernels import chapter4_kernels
    from bookutils.benchmark import with_backward

    kernels = chapter4_kernels()
    attention = with_backward(flash_forward_tuned, kernels.flash_attention_backward)
    leaves = [torch.randn(1, 2, 37, 16, dtype=torch.float64).requires_grad_() for _ in range(3)]
    do = torch.randn(1, 2, 37, 16, dtype=torch.float64)
    found = torch.autograd.grad(attention(*(t.float().to(DEVICE) for t in leaves), True), leaves, do.to(DEVICE))
    expected = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True),
                                   leaves, do)
    for f, e in zip(found, expected):
        torch.testing.assert_close(f.double().cpu(), e, atol=1e-4 if DEVICE == "cpu" else 3e-2, rtol=0)
