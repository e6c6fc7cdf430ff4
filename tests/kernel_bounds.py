"""The book's forward kernels against the float64 reference, within the rounding-error
bound of the computation (autograde.bounds): float32 products in the interpreter, TF32
operands on a GPU, 16-bit storage, scores of any size. One rule for every machine."""
import numpy as np

from autograde.bounds import forward_bounds
from autograde.reference import flash as ref


def assert_forward_within_bounds(out, lse, q, k, v, causal=False, sm_scale=None):
    """out and lse of a forward kernel run on q, k, v (torch tensors of one dtype)."""
    q64, k64, v64 = (t.detach().double().cpu().numpy() for t in (q, k, v))
    want_out, want_lse = ref.attention_with_lse(q64, k64, v64, causal, sm_scale)
    out_bound, lse_bound = forward_bounds(q64, k64, v64, causal, sm_scale, q.dtype, q.device.type == "cuda")
    for name, found, want, bound in (("output", out, want_out, out_bound), ("log-sum-exp", lse, want_lse, lse_bound)):
        error = np.abs(found.detach().double().cpu().numpy() - want)
        assert np.all(error <= bound), (f"{name}: error {error.max():.3g} at {np.unravel_index(error.argmax(), error.shape)}"
                                        f" beyond the bound {bound.reshape(error.shape)[np.unravel_index(error.argmax(), error.shape)]:.3g}")
