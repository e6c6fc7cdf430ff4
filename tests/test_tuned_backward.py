"""The tuned backward (autograde.tuned_backward) computes what the exercise's
backward computes: dQ, dK and dV within the first-order rounding-error bound of
autograde.bounds against the float64 reference, for ragged lengths, causal or
not, grouped-query heads, head widths 16 to 128, strided inputs and float16;
each GPU configuration run in the interpreter below the autotuner; the autograd
Function (the tuned forward with this backward) against torch autograd in
float64; the same gradients bitwise on a second run. The compile report: every
configuration compiles for an A100 and an H100 at d = 64 and 128, causal or
not, even and ragged lengths, without spills, within shared memory, with
warpgroup MMA on the H100. Kernels run in Triton's interpreter here, natively on
a GPU. Imports nothing that needs nbformat or scripts/env.sh."""
import numpy as np
import pytest
import torch

from autograde import tuned_backward as tb
from autograde.bounds import backward_bounds
from autograde.reference import flash as ref
from bookutils.flash_tuned import flash_forward_tuned
from coursekit.triton_env import triton_device
from coursekit.triton_trace import interpreting

DEVICE = triton_device(quiet=True)
NATIVE = DEVICE == "cuda"


def _inputs(batch, heads, kv_heads, n, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(batch, heads, n, d, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    k, v = (torch.randn(batch, kv_heads, n, d, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    return q, k, v, do


def _forward(q, k, v, causal, sm_scale=None):
    group = q.shape[1] // k.shape[1]
    return flash_forward_tuned(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal=causal,
                               sm_scale=sm_scale)


def assert_backward_within_bounds(grads, q, k, v, o, lse, do, causal, sm_scale=None):
    """dq, dk, dv against the float64 reference computed from the o and lse handed to the kernel."""
    arrays = [t.detach().double().cpu().numpy() for t in (q, k, v, do, o, lse)]
    want = ref.attention_backward(*arrays[:4], causal, sm_scale, o=arrays[4], lse=arrays[5])
    bounds = backward_bounds(*arrays, causal, sm_scale, q.dtype, NATIVE)
    for name, found, exact, bound in zip(("dq", "dk", "dv"), grads, want, bounds):
        assert found.shape == exact.shape and found.dtype == q.dtype, (name, found.shape, found.dtype)
        error = np.abs(found.double().cpu().numpy() - exact)
        worst = np.unravel_index(np.argmax(error / bound), error.shape)
        assert np.all(error <= bound), f"{name}: error {error[worst]:.3g} at {worst}, bound {bound[worst]:.3g}"


@pytest.mark.parametrize("n, d, heads, kv_heads, causal", [
    (1, 16, 2, 2, True), (17, 16, 2, 2, False), (17, 16, 4, 1, True), (100, 64, 2, 2, True),
    (100, 64, 4, 2, False), (130, 64, 2, 1, True), (130, 128, 2, 2, False), (130, 128, 4, 4, True),
    (64, 40, 2, 2, True), (97, 80, 4, 2, True)])
def test_tuned_backward_matches_the_reference_in_float16(n, d, heads, kv_heads, causal):
    q, k, v, do = _inputs(1, heads, kv_heads, n, d, torch.float16, n * d + heads)
    o, lse = _forward(q, k, v, causal)
    assert_backward_within_bounds(tb.tuned_backward(q, k, v, o, lse, do, causal), q, k, v, o, lse, do, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_tuned_backward_in_float32_with_a_custom_scale(causal):
    q, k, v, do = _inputs(2, 4, 2, 45, 32, torch.float32, 3)
    o, lse = _forward(q, k, v, causal, 0.3)
    grads = tb.tuned_backward(q, k, v, o, lse, do, causal, sm_scale=0.3)
    assert_backward_within_bounds(grads, q, k, v, o, lse, do, causal, 0.3)


@pytest.mark.parametrize("causal", [False, True])
def test_tuned_backward_reads_strided_views(causal):
    """(batch, n, heads, d) storage viewed as (batch, heads, n, d), and a last axis
    without unit stride (copied)."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 70, 4, 32, generator=gen).half().to(DEVICE)
    kv = torch.randn(2, 70, 2, 2, 32, generator=gen).half().to(DEVICE)
    q = x.transpose(1, 2)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    do = torch.randn(2, 4, 32, 70, generator=gen).half().to(DEVICE).transpose(2, 3)   # last stride 70
    o, lse = _forward(q, k, v, causal)
    o = o.transpose(1, 2).contiguous().transpose(1, 2)                                   # O strided too
    assert_backward_within_bounds(tb.tuned_backward(q, k, v, o, lse, do, causal), q, k, v, o, lse, do, causal)


ALL_CONFIGS = sorted(tb.all_configs())


@pytest.mark.parametrize("block_m, block_n, warps, stages", ALL_CONFIGS)
@pytest.mark.parametrize("n, d, causal", [(256, 64, True), (256, 64, False), (200, 40, True), (200, 40, False)])
def test_every_gpu_configuration_computes_the_gradients(block_m, block_n, warps, stages, n, d, causal):
    """The configurations autotuning picks from, each run below the autotuner (its
    heuristics kept), on lengths that are and are not a multiple of the blocks,
    with grouped heads."""
    q, k, v, do = _inputs(1, 2, 1, n, d, torch.float16, n + d)
    o, lse = _forward(q, k, v, causal)
    head = max(16, 1 << (d - 1).bit_length())
    delta, lse2 = (torch.empty(1, 2, n, device=DEVICE) for _ in range(2))
    tb._preprocess_kernel[(-(-n // tb.PREPROCESS_BLOCK), 2)](o, do, lse, delta, lse2, n, d, 2, *o.stride()[:3],
                                                            *do.stride()[:3], BLOCK=tb.PREPROCESS_BLOCK, HEAD=head)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale = d ** -0.5
    tb._tuned_backward_kernel.fn[(-(-n // block_n), 1)](
        q, k, v, do, dq, dk, dv, lse2, delta, n, d, 1, 2, scale * tb.LOG2_E, scale, *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *do.stride()[:3], *dq.stride()[:3], *dk.stride()[:3], HEAD=head, CAUSAL=causal,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    assert_backward_within_bounds((dq, dk, dv), q, k, v, o, lse, do, causal)


def test_the_gradients_are_bitwise_reproducible():
    """No atomics: each gradient element is summed by one program in one order."""
    q, k, v, do = _inputs(1, 4, 2, 100, 32, torch.float16, 5)
    o, lse = _forward(q, k, v, True)
    first, second = (tb.tuned_backward(q, k, v, o, lse, do, True) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("heads, kv_heads, causal", [(2, 2, False), (4, 2, True), (4, 1, False)])
def test_tuned_attention_function_matches_torch_autograd(heads, kv_heads, causal):
    """tuned_attention (flash_forward_tuned + tuned_backward) against autograd through
    float64 attention: the rounding of float32 arithmetic leaves 1e-4 of room."""
    q, k, v, do = _inputs(2, heads, kv_heads, 50, 16, torch.float32, heads + kv_heads)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = tb.tuned_attention(*leaves, causal=causal)
    grads = torch.autograd.grad(out, leaves, do)
    exact = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    group = heads // kv_heads
    want_out = torch.nn.functional.scaled_dot_product_attention(
        exact[0], exact[1].repeat_interleave(group, 1), exact[2].repeat_interleave(group, 1), is_causal=causal)
    want = torch.autograd.grad(want_out, exact, do.double().cpu())
    torch.testing.assert_close(out.double().cpu(), want_out.detach(), rtol=0, atol=1e-5)
    for found, expected in zip(grads, want):
        assert found.shape == expected.shape
        torch.testing.assert_close(found.double().cpu(), expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("change, match", [
    (lambda t: {**t, "k": t["k"][:, :, :5]}, "must be"), (lambda t: {**t, "lse": t["lse"][..., :3]}, "lse must"),
    (lambda t: {**t, "k": torch.cat([t["k"], t["k"][:, :1]], 1), "v": torch.cat([t["v"], t["v"][:, :1]], 1)},
     "multiple"),
    (lambda t: {**t, "do": t["do"].half()}, "one dtype")])
def test_tuned_backward_refuses_what_it_cannot_read(change, match):
    q, k, v, do = _inputs(1, 4, 2, 8, 16, torch.float32, 0)
    o, lse = _forward(q, k, v, False)
    args = change(dict(q=q, k=k, v=v, o=o, lse=lse, do=do))
    with pytest.raises(ValueError, match=match):
        tb.tuned_backward(**args)


def test_tuned_backward_refuses_offsets_past_32_bits():
    big = torch.empty(1, 1, 2, 16, device="meta").as_strided((1, 1, 2, 16), (0, 0, 2**31, 1))
    small = torch.empty(1, 1, 2, 16, device="meta")
    with pytest.raises(ValueError, match="offsets within a head of q reach 2,147,483,663"):
        tb.tuned_backward(big, small, small, small, torch.empty(1, 1, 2, device="meta"), small)


def test_under_the_interpreter_one_configuration_is_tuned():
    configs = tb._tuned_backward_kernel.configs
    if interpreting():
        assert len(configs) == 1 and configs[0].kwargs == dict(zip(("BLOCK_M", "BLOCK_N"), tb.INTERPRETER_CONFIG))
    else:
        assert len(configs) == len(ALL_CONFIGS)
    assert all(n % m == 0 and n in (64, 128) for m, n, _, _ in ALL_CONFIGS)   # whole blocks on the band; 64-row tiles


def test_autotuning_keeps_the_configurations_screened_for_the_head_width():
    configs = [tb._config(*c) for c in ALL_CONFIGS]
    for head in (16, 64, 128):
        for group in (1, 2, 4):
            kept = tb._prune(configs, {"group": group}, HEAD=head)
            assert {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in kept} == \
                set(tb.configs_for(head, group))
    assert tb.configs_for(128, 2) != tb.configs_for(128)


# ---------------------------------------------------------------- the compile report

@pytest.fixture(scope="module")
def reports():
    from coursekit.compile_worker import backend_problem

    problem = backend_problem()
    if problem is not None:
        pytest.skip(problem)
    from coursekit import compile_report as cr

    return cr.compile_reports(tb.screened_launches(), targets=("A100", "H100"), workers=2)


def test_the_launches_cover_every_configuration_and_variant():
    variants = {}
    for launch in tb.launches():                       # group = 1
        c = dict(launch.spec.constexprs)
        if launch.spec.kernel == "_tuned_backward_kernel":
            variants.setdefault((c["HEAD"], c["CAUSAL"], c["EVEN_N"]), set()).add(
                (c["BLOCK_M"], c["BLOCK_N"], launch.spec.num_warps, launch.spec.num_stages))
    assert set(variants) == {(h, c, e) for h in (64, 128) for c in (False, True) for e in (False, True)}
    assert all(configs == set(tb.configs_for(head)) for (head, _, _), configs in variants.items())
    grouped = {(c["HEAD"], c["CAUSAL"], c["BLOCK_M"], c["BLOCK_N"], launch.spec.num_warps, launch.spec.num_stages)
               for launch in tb.screened_launches() for c in [dict(launch.spec.constexprs)]
               if launch.spec.kernel == "_tuned_backward_kernel" and "group" not in c}   # group = 4: not a constant
    assert grouped == {(h, causal, *config) for h in (64, 128) for causal in (False, True)
                       for config in tb.configs_for(h, 4)}


def test_every_configuration_compiles_without_spills_within_shared_memory(reports):
    from coursekit.compile_report import render

    bad = [f"{r.kernel} [{r.spec.label()}] on {t.target}: {t.problem() or 'spills'}"
           for r in reports for t in r.targets if not t.compiles or t.spills or t.problem()]
    assert not bad, "\n".join(bad) + "\n" + render(reports)


def test_every_configuration_uses_warpgroup_mma_on_h100_and_mma_on_a100(reports):
    main = [r for r in reports if r.kernel == "_tuned_backward_kernel"]
    assert main and all(r["H100"].mma_kind == "HGMMA" for r in main), [r.spec.label() for r in main
                                                                        if r["H100"].mma_kind != "HGMMA"]
    assert all(r["A100"].mma.get("HMMA", 0) > 0 for r in main)
