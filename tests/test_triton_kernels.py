"""The book's Triton kernels on inputs the chapter's pages do not show: head
dimensions that are not powers of two (the kernels pad them to one and must mask
the padding) and strided (batch, n, heads, d) views of a packed QKV tensor, which
the launchers must read in place, without contiguous copies."""
import re

import numpy as np
import pytest
import torch

from autograde.reference import flash as ref
from coursekit.torch_memory import TorchTensorBytes
from coursekit.triton_env import triton_device

from tests.kernel_bounds import assert_forward_within_bounds

DEVICE = triton_device(quiet=True)


def packed_views(batch, n, heads, d, seed):
    """q, k, v as (batch, heads, n, d) views into one (batch, n, heads, 4d) tensor whose
    last d columns are NaN: a load that strays past column d of v, or reads padding
    lanes of q or k unmasked, puts NaN or a neighbour's values into the result."""
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randn(batch, n, heads, 4 * d, generator=gen)
    packed[..., 3 * d:] = float("nan")
    packed = packed.to(DEVICE)
    return tuple(packed[..., i * d:(i + 1) * d].transpose(1, 2) for i in range(3))


def reference(q, k, v, causal):
    return ref.attention_with_lse(*(t.detach().double().cpu().numpy() for t in (q, k, v)), causal)


@pytest.mark.parametrize("d", [48, 80])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_forward_on_strided_views_with_a_padded_head_dimension(d, causal):
    from bookutils.triton_kernels import flash_forward

    q, k, v = packed_views(2, 45, 3, d, seed=d)
    assert not q.is_contiguous() and q.stride(-1) == 1
    out, lse = flash_forward(q, k, v, causal=causal)
    assert_forward_within_bounds(out, lse, q, k, v, causal)


@pytest.mark.parametrize("d", [48, 80])
def test_standard_attention_on_strided_views_with_a_padded_head_dimension(d):
    from bookutils.triton_kernels import standard_attention

    q, k, v = packed_views(1, 37, 2, d, seed=d + 1)
    out = standard_attention(q, k, v)
    ref_out, ref_lse = reference(q, k, v, False)
    assert_forward_within_bounds(out, torch.from_numpy(ref_lse), q, k, v)   # its P goes through memory: no lse


def test_launchers_allocate_only_their_outputs_for_strided_views():
    """A contiguous copy of q, k and v would show up as three more tensors of q's size."""
    from bookutils.triton_kernels import flash_forward

    q, k, v = packed_views(1, 64, 2, 48, seed=0)
    flash_forward(q, k, v)                   # first call compiles or loads code
    with TorchTensorBytes() as seen:
        out, lse = flash_forward(q, k, v)
    assert seen.peak == out.nbytes + lse.nbytes, (seen.peak, out.nbytes, lse.nbytes)


# --- inputs the kernels cannot read are refused with a message, before any launch -------

from bookutils import triton_demo  # noqa: E402
from bookutils.triton_kernels import flash_forward, standard_attention  # noqa: E402


def qkv(q_shape=(1, 2, 8, 16), k_shape=None, v_shape=None, dtypes=(torch.float32,) * 3):
    shapes = (q_shape, k_shape or q_shape, v_shape or q_shape)
    return [torch.randn(*shape).to(DEVICE, dtype) for shape, dtype in zip(shapes, dtypes)]


REFUSED = {
    "shorter keys": (qkv(k_shape=(1, 2, 4, 16), v_shape=(1, 2, 4, 16)), "same (batch, heads, n, d)"),
    "fewer key-value heads": (qkv(k_shape=(1, 1, 8, 16), v_shape=(1, 1, 8, 16)), "same (batch, heads, n, d)"),
    "another value width": (qkv(v_shape=(1, 2, 8, 32)), "same (batch, heads, n, d)"),
    "mixed dtypes": (qkv(dtypes=(torch.float32, torch.float16, torch.float32)), "one dtype"),
    "three axes": ([torch.randn(2, 8, 16, device=DEVICE)] * 3, "(batch, heads, n, d) tensor"),
    "too many (batch, head) pairs": ([torch.empty(1, 1, 1, 16, device=DEVICE).expand(65_536, 1, 1, 16)] * 3,
                                     "65,535"),
}


@pytest.mark.parametrize("launcher", [flash_forward, standard_attention], ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", REFUSED)
def test_inputs_the_kernels_cannot_read_are_refused_with_the_reason(launcher, case):
    tensors, reason = REFUSED[case]
    with pytest.raises(ValueError, match=re.escape(reason)) as error:
        launcher(*tensors)
    assert launcher.__name__ in str(error.value)


def test_the_grid_limit_is_65535_pairs_of_batch_and_head():
    from bookutils.triton_kernels import _check_inputs
    at_limit = torch.empty(1, 1, 1, 16).expand(65_535, 1, 1, 16)
    assert _check_inputs("flash_forward", at_limit, at_limit, at_limit) == (65_535, 1, 1, 16)
    past = torch.empty(1, 1, 1, 16).expand(32_768, 2, 1, 16)
    with pytest.raises(ValueError, match="65,536 programs"):
        _check_inputs("flash_forward", past, past, past)


def test_demo_kernels_refuse_tensors_their_32_bit_offsets_cannot_address():
    with pytest.raises(ValueError, match="32-bit offsets"):
        triton_demo._fits_int32(torch.empty(1).expand(2**31))
    triton_demo._fits_int32(torch.empty(1).expand(2**31 - 1))


def test_softmax_launcher_refuses_a_view_whose_row_offsets_pass_32_bits():
    """One column of a (2**20, 2**12) matrix: 2**20 elements, but its last row lies
    (2**20 - 1) * 2**12 elements from the first. On the meta device: no memory."""
    column = torch.empty(2**20, 2**12, device="meta")[:, :1]
    with pytest.raises(ValueError, match="32-bit offsets"):
        triton_demo.softmax_rows_triton(column)
    triton_demo._fits_int32(torch.empty(2**19, 2**12, device="meta")[:, :1])    # last offset below 2**31


def test_vector_add_on_strided_views():
    """add_kernel indexes its inputs as contiguous: the launcher must hand it contiguous ones."""
    from bookutils.triton_demo import vector_add

    x = torch.arange(40.0, device=DEVICE)[::2]          # every other element: stride 2
    y = (torch.arange(60.0, device=DEVICE) * 10.0)[::3]   # stride 3
    assert not x.is_contiguous() and not y.is_contiguous()
    expected = x.cpu().numpy() + y.cpu().numpy()
    np.testing.assert_allclose(vector_add(x, y).cpu().numpy(), expected)
