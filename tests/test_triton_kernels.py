"""The book's Triton kernels on inputs the chapter's pages do not show: head
dimensions that are not powers of two (the kernels pad them to one and must mask
the padding) and strided (batch, n, heads, d) views of a packed QKV tensor, which
the launchers must read in place, without contiguous copies."""
import numpy as np
import pytest
import torch

from autograde.reference import flash as ref
from coursekit.torch_memory import TorchTensorBytes
from coursekit.triton_env import triton_device

DEVICE = triton_device(quiet=True)
TOL = 1e-5 if DEVICE == "cpu" else 2e-2      # float32 in the interpreter; TF32 products on a GPU


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
    ref_out, ref_lse = reference(q, k, v, causal)
    np.testing.assert_allclose(out.cpu().numpy(), ref_out, atol=TOL)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=TOL)


@pytest.mark.parametrize("d", [48, 80])
def test_standard_attention_on_strided_views_with_a_padded_head_dimension(d):
    from bookutils.triton_kernels import standard_attention

    q, k, v = packed_views(1, 37, 2, d, seed=d + 1)
    out = standard_attention(q, k, v)
    np.testing.assert_allclose(out.cpu().numpy(), reference(q, k, v, False)[0], atol=TOL)


def test_launchers_allocate_only_their_outputs_for_strided_views():
    """A contiguous copy of q, k and v would show up as three more tensors of q's size."""
    from bookutils.triton_kernels import flash_forward

    q, k, v = packed_views(1, 64, 2, 48, seed=0)
    flash_forward(q, k, v)                   # first call compiles or loads code
    with TorchTensorBytes() as seen:
        out, lse = flash_forward(q, k, v)
    assert seen.peak == out.nbytes + lse.nbytes, (seen.peak, out.nbytes, lse.nbytes)
