"""Chapter 4's instructor tools: the references agree with PyTorch, the IO model
agrees with bytes counted in Triton's interpreter, the kernel tracer counts
exactly and cleans up, and the memory tracker is not fooled by Triton's
interpreter re-wrapping its inputs. Kernels run in the interpreter here (set by
conftest when there is no GPU), and natively on a GPU."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coursekit.memory import traced_peak
from autograde.reference import flash as ref
from coursekit.torch_memory import TorchTensorBytes
from coursekit.triton_env import triton_device
from coursekit.triton_trace import interpreting, trace_kernels
from tests.conftest import REPO

DEVICE = triton_device(quiet=True)
rng = np.random.default_rng(4)
needs_interpreter = pytest.mark.skipif(DEVICE == "cuda", reason="byte counts come from Triton's interpreter")


def torch_attention(q, k, v, causal=False, scale=None):
    return F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=causal,
                                          scale=scale).numpy()


@pytest.mark.parametrize("shape, block", [((9,), 2), ((3, 16), 5), ((2, 3, 7), 7), ((4, 5), 100)])
def test_online_stats_equal_the_direct_max_and_sum(shape, block):
    x = rng.normal(scale=50, size=shape)
    x[..., 0] = -np.inf
    m, l = ref.online_softmax_stats(x, block)
    np.testing.assert_array_equal(m, x.max(axis=-1))
    np.testing.assert_allclose(np.log(l) + m, torch.logsumexp(torch.from_numpy(x), -1).numpy(), rtol=1e-13)


def test_online_stats_of_a_fully_masked_row_are_minus_infinity_and_zero():
    m, l = ref.online_softmax_stats(np.full((2, 6), -np.inf), 4)
    assert np.all(m == -np.inf) and np.all(l == 0.0)


@pytest.mark.parametrize("lead, n, d, bm, bn, causal", [((), 10, 4, 3, 4, False), ((2,), 17, 8, 16, 5, True),
                                                         ((2, 3), 1, 2, 4, 4, True), ((), 33, 16, 32, 32, False)])
def test_tiled_reference_matches_torch_sdpa(lead, n, d, bm, bn, causal):
    q, k, v = (rng.normal(size=lead + (n, d)) for _ in range(3))
    np.testing.assert_allclose(ref.tiled_attention(q, k, v, bm, bn, causal), torch_attention(q, k, v, causal),
                               rtol=1e-10, atol=1e-12)


def test_lse_reference_matches_torch_logsumexp():
    q, k, v = (rng.normal(size=(2, 12, 8)) for _ in range(3))
    out, lse = ref.attention_with_lse(q, k, v, causal=True, sm_scale=0.3)
    s = torch.from_numpy(q @ k.transpose(0, 2, 1) * 0.3).masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1),
                                                                     float("-inf"))
    np.testing.assert_allclose(lse, torch.logsumexp(s, -1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(out, torch_attention(q, k, v, True, 0.3), rtol=1e-10, atol=1e-12)


def test_standard_traffic_counts_each_matrix_read_or_written():
    n, d = 7, 3
    sizes = {"Q": n * d, "K": n * d, "V": n * d, "O": n * d, "S": n * n, "P": n * n}
    moved = ["Q", "K", "S", "S", "P", "P", "V", "O"]   # read Q, K; write S; read S; write P; read P, V; write O
    assert ref.hbm_traffic_standard(n, d) == sum(sizes[m] for m in moved)


@needs_interpreter
@pytest.mark.parametrize("n, block", [(64, 32), (100, 32), (50, 16)])
def test_io_model_equals_bytes_counted_in_the_interpreter(n, block):
    """The chapter's kernels, traced: the fused kernel moves the model's elements
    plus n for the log-sum-exp; the three-kernel version moves exactly 4n^2 more."""
    from bookutils.triton_kernels import flash_forward, standard_attention

    d = 16
    q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
    with trace_kernels() as fused:
        flash_forward(q, k, v, block_m=block, block_n=block)
    with trace_kernels() as staged:
        standard_attention(q, k, v, block_m=block, block_n=block)
    assert fused.bytes_moved // 4 == ref.hbm_traffic_flash(n, d, block) + n
    assert staged.bytes_moved // 4 - fused.bytes_moved // 4 == 4 * n * n - n
    assert dict(fused.launches) == {"_flash_forward_kernel": 1}
    assert sum(staged.launches.values()) == 3


@needs_interpreter
def test_tracer_counts_masked_lanes_only_and_restores_the_interpreter():
    import triton
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_masked_load
    n, block = 1000, 128
    x, y, o = torch.randn(n), torch.randn(n), torch.empty(n)
    with trace_kernels() as trace:
        _add_kernel[(triton.cdiv(n, block),)](x, y, o, n, BLOCK=block)
    torch.testing.assert_close(o, x + y)
    assert (trace.bytes_loaded, trace.bytes_stored) == (2 * n * 4, n * 4)
    assert trace.launches["_add_kernel"] == 1
    assert interpreter.InterpreterBuilder.create_masked_load is original


def _define_add_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _add_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(o_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    return _add_kernel


_add_kernel = _define_add_kernel()


def _define_atomic_sum_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _atomic_sum_kernel(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.atomic_add(total_ptr + offsets % 4, tl.load(x_ptr + offsets, mask=mask), mask=mask)

    return _atomic_sum_kernel


_atomic_sum_kernel = _define_atomic_sum_kernel()


@needs_interpreter
def test_tracer_counts_an_atomic_add_as_a_load_and_a_store_of_its_lanes():
    import triton
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_atomic_rmw
    n, block = 1000, 128
    x, total = torch.randn(n), torch.zeros(4)
    with trace_kernels() as trace:
        _atomic_sum_kernel[(triton.cdiv(n, block),)](x, total, n, BLOCK=block)
    torch.testing.assert_close(total, x.reshape(-1, 4).sum(0))
    # x is read once by tl.load; each of the n atomic lanes reads and writes one float32
    assert (trace.bytes_loaded, trace.bytes_stored) == (2 * n * 4, n * 4)
    assert interpreter.InterpreterBuilder.create_atomic_rmw is original


def test_tensor_tracker_does_not_count_a_view_onto_an_existing_storage():
    """Triton's interpreter re-wraps each input with Tensor.set_(storage): no new memory."""
    x = torch.randn(10_000)
    with TorchTensorBytes() as seen:
        alias = x.new_empty(0).set_(x.untyped_storage(), 0, x.size(), x.stride())
        fresh = torch.empty(1000)
    assert seen.peak == fresh.nbytes
    del alias


@pytest.mark.parametrize("causal", [False, True])
def test_book_kernel_matches_the_reference_and_its_memory_does_not_grow_with_n(causal):
    from bookutils.triton_kernels import flash_forward

    q, k, v = (torch.randn(2, 2, 45, 32) for _ in range(3))
    out, lse = flash_forward(*(t.to(DEVICE) for t in (q, k, v)), causal=causal)
    ref_out, ref_lse = ref.attention_with_lse(q.double().numpy(), k.double().numpy(), v.double().numpy(), causal)
    tol = 1e-5 if DEVICE == "cpu" else 2e-2
    np.testing.assert_allclose(out.cpu().numpy(), ref_out, atol=tol)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=tol)
    if DEVICE == "cpu":
        beyond_output = []
        for n in (128, 512):
            x = torch.randn(1, 1, n, 16)
            flash_forward(x, x, x)            # the first call at a size loads code and fills caches
            _, peak = traced_peak(flash_forward, x, x, x)
            beyond_output.append(peak - n * 16 * 4 - n * 4)
        assert beyond_output[1] < 1.2 * beyond_output[0] + 2**14, beyond_output


def test_benchmark_command_prints_the_table_for_this_machine(tmp_path):
    saved = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "bookutils.benchmark", "--save", str(saved)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(saved.read_text())
    assert record["device"]["type"] == DEVICE and record["versions"]["torch"] == torch.__version__
    printed = [line.split() for line in proc.stdout.splitlines()]
    for table in record["tables"].values():      # every saved row is a printed row
        for row in table:                        # (decoding rows have a cache length and a batch, not n)
            size = str(row["n"] if "n" in row else row["length"])
            assert any(size in line and row["method"].split()[0] in line for line in printed), row
    if DEVICE == "cuda":
        assert "TFLOP/s" in proc.stdout and "SDPA, FLASH_ATTENTION backend" in proc.stdout
    else:
        assert "No GPU" in proc.stdout
        rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith(("Triton", "naive"))]
        kernel = {int(r[-3]): float(r[-2]) for r in rows if r[0] == "Triton"}
        naive = {int(r[-3]): float(r[-2]) for r in rows if r[0] == "naive"}
        largest = max(kernel)
        assert kernel[largest] < naive[largest] / 2, proc.stdout


def test_interpreter_is_chosen_exactly_when_there_is_no_gpu():
    assert interpreting() == (not torch.cuda.is_available())


@pytest.mark.parametrize("heads, kv_heads, causal, scale", [(2, 2, False, None), (4, 2, True, 0.3), (3, 1, True, None)])
def test_backward_reference_matches_autograd_with_grouped_heads(heads, kv_heads, causal, scale):
    q, do = (rng.normal(size=(2, heads, 9, 8)) for _ in range(2))
    k, v = (rng.normal(size=(2, kv_heads, 9, 8)) for _ in range(2))
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    group = heads // kv_heads
    out = F.scaled_dot_product_attention(leaves[0], leaves[1].repeat_interleave(group, 1),
                                         leaves[2].repeat_interleave(group, 1), is_causal=causal, scale=scale)
    out.backward(torch.from_numpy(do))
    for found, leaf in zip(ref.attention_backward(q, k, v, do, causal, scale), leaves):
        np.testing.assert_allclose(found, leaf.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_merged_chunk_states_equal_the_whole_row():
    from autograde.checks.flash import chunk_states

    s, v = rng.normal(scale=20, size=(4, 11)), rng.normal(size=(4, 11, 3))
    s[1] = -np.inf
    m, l, o = ref.merge_softmax_states(*chunk_states(s, v, [(0, 3), (3, 4), (4, 11)]))
    whole_m, whole_l, whole_o = chunk_states(s, v, [(0, 11)])
    np.testing.assert_array_equal(m, whole_m[0])
    np.testing.assert_allclose(l, whole_l[0], rtol=1e-12)
    np.testing.assert_allclose(o, whole_o[0], rtol=1e-10, atol=1e-12)


def test_decode_reference_matches_sdpa_on_each_prefix():
    q = rng.normal(size=(2, 4, 8))
    k, v = (rng.normal(size=(2, 2, 13, 8)) for _ in range(2))
    out = ref.decode_attention(q, k, v, [13, 5])
    for b, n in enumerate((13, 5)):
        expected = torch_attention(q[b][:, None], np.repeat(k[b, :, :n], 2, 0), np.repeat(v[b, :, :n], 2, 0))[:, 0]
        np.testing.assert_allclose(out[b], expected, rtol=1e-10, atol=1e-12)


def test_benchmark_tables_of_the_gpu_run_anywhere_and_time_correct_kernels(monkeypatch):
    """The GPU path cannot run here, so its table code runs on this device with a
    wall-clock timer and PyTorch's math backend standing in for the flash one: every
    method gets a row, and the decoding step it times equals SDPA's."""
    import time

    import torch.nn.attention as attention

    from bookutils import benchmark

    pinned = attention.sdpa_kernel
    monkeypatch.setattr(attention, "sdpa_kernel", lambda backend: pinned(attention.SDPBackend.MATH))
    kernels, why = benchmark.solution_kernels()
    assert kernels is not None, why

    def timer(fn):
        started = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - started)

    tuned, why = benchmark.tuned_backward_attention()
    assert tuned is not None, why
    rows = benchmark.training_rows(kernels, sizes=(33,), batch=1, heads=2, d=16, dtype=torch.float32, device=DEVICE,
                                   timer=timer, causal=True, tuned=tuned)
    assert [r["method"] for r in rows] == ["SDPA, FLASH_ATTENTION backend", "teaching forward, instructor's backward",
                                           "tuned forward, instructor's backward", benchmark.TUNED_PAIR]
    assert all(r["tflops"] > 0 for r in rows)
    tuned_decode, why = benchmark.tuned_decoding()
    assert tuned_decode is not None, why
    rows = benchmark.decode_rows(kernels, lengths=(70,), batches=(2,), heads=4, kv_heads=2, d=16,
                                 dtype=torch.float32, device=DEVICE, timer=timer, tuned=tuned_decode)
    assert {r["method"] for r in rows} == {benchmark.SDPA_DECODE, "instructor's split-K kernels",
                                           benchmark.TUNED_DECODE}
    q = torch.randn(2, 4, 16, device=DEVICE)
    k_cache, v_cache = (torch.randn(2, 2, 70, 16, device=DEVICE) for _ in range(2))
    ours = kernels.decode_attention(q, k_cache, v_cache, torch.full((2,), 70, dtype=torch.int32, device=DEVICE))
    grouped = benchmark.sdpa_flash_decode(q, k_cache, v_cache)                   # enable_gqa, caches as they are
    expanded = benchmark.sdpa_flash_decode(q, *(c.repeat_interleave(2, dim=1) for c in (k_cache, v_cache)),
                                           enable_gqa=False)
    torch.testing.assert_close(ours, grouped, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tuned_decode(q, k_cache, v_cache, torch.full((2,), 70, dtype=torch.int32)), grouped,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped, expanded, atol=1e-6, rtol=1e-6)


def test_benchmark_falls_back_to_expanded_caches_and_says_so(monkeypatch):
    """Where the backend refuses enable_gqa, SDPA's decoding row reads caches
    expanded to one head per query head, and its method names the expansion."""
    from bookutils import benchmark

    real = benchmark.sdpa_flash_decode

    def refusing(q, k_cache, v_cache, enable_gqa=True):
        if enable_gqa:
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k_cache, v_cache, enable_gqa=False)

    monkeypatch.setattr(benchmark, "sdpa_flash_decode", refusing)
    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", _math_backend(torch.nn.attention.sdpa_kernel))
    q = torch.randn(1, 8, 16)
    k_cache, v_cache = (torch.randn(1, 2, 30, 16) for _ in range(2))
    name, call = benchmark.sdpa_decode_call(q, k_cache, v_cache)
    assert name.startswith("SDPA, FLASH_ATTENTION backend, caches expanded 4x (enable_gqa refused: No available")
    torch.testing.assert_close(call(), real(q, k_cache, v_cache, enable_gqa=True))


def _math_backend(pinned):
    import torch.nn.attention as attention

    return lambda backend: pinned(attention.SDPBackend.MATH)


def test_benchmark_leaves_out_the_solution_rows_without_the_grading_package(monkeypatch):
    from bookutils import benchmark

    monkeypatch.setitem(sys.modules, "autograde.solution_kernels", None)   # import fails, as in the release
    kernels, why = benchmark.solution_kernels()
    assert kernels is None and why == benchmark.NO_SOLUTIONS
    monkeypatch.setitem(sys.modules, "autograde.tuned_backward", None)
    assert benchmark.tuned_backward_attention() == (None, benchmark.NO_TUNED_BACKWARD)
    monkeypatch.setitem(sys.modules, "autograde.tuned_decode", None)
    assert benchmark.tuned_decoding() == (None, benchmark.NO_TUNED_DECODE)


@pytest.mark.parametrize("flags, decoded", [([], True), (["--no-decode"], False)])
def test_the_gpu_command_saves_what_it_prints(monkeypatch, tmp_path, capsys, flags, decoded):
    """main's GPU branch, with each table's timed rows stood in for: every table it
    prints is saved, and --no-decode leaves out the decoding table and its note."""
    from bookutils import benchmark

    monkeypatch.setattr(benchmark, "DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    monkeypatch.setattr(benchmark, "tuned_decoding", lambda: (None, "no tuned decoding here"))
    monkeypatch.setattr(benchmark, "matmul_peak", lambda: {"method": "torch.matmul", "n": 8, "ms": 1.0, "tflops": 100.0})
    row = {"method": "a method", "n": 64, "ms": 1.0, "tflops": 50.0, "peak_mib": 1.0}
    monkeypatch.setattr(benchmark, "gpu_rows", lambda **kw: [dict(row)])
    monkeypatch.setattr(benchmark, "training_rows", lambda *a, **kw: [dict(row)])
    monkeypatch.setattr(benchmark, "decode_rows", lambda *a, **kw: [{"method": "a step", "batch": 1, "length": 1024,
                                                                      "us": 9.0}])
    benchmark.main(["--head-dim", "128", "--causal", *flags, "--save", str(tmp_path / "run.json")])
    saved = json.loads((tmp_path / "run.json").read_text())
    printed = capsys.readouterr().out
    assert saved["settings"]["head_dim"] == 128 and saved["settings"]["causal"] is True
    assert saved["tables"]["forward"][0]["matmul_share"] == 0.5 and "50%" in printed
    assert ("decode" in saved["tables"]) == decoded == ("One decoding step" in printed)
    assert ("no tuned decoding here" in printed) == decoded


def test_the_benchmark_finds_every_kernel_on_a_machine_without_jupyter():
    """A lent GPU machine runs the benchmark from a checkout with PYTHONPATH alone:
    no nbformat, traitlets or nbgrader there. The instructor's rows must not vanish."""
    probe = textwrap.dedent("""
        import sys
        for name in ("nbformat", "traitlets", "nbgrader", "nbconvert", "jupyter_client", "IPython"):
            sys.modules[name] = None                       # importing any of them now fails
        from bookutils import benchmark
        for found, why in (benchmark.solution_kernels(), benchmark.tuned_backward_attention(),
                           benchmark.tuned_decoding()):
            assert found is not None, why
        print("every kernel found")
    """)
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "every kernel found" in proc.stdout, proc.stderr[-3000:]


# ---------------------------------------------------------------- a launcher's call, recorded and replayed

def _define_replay_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _affine_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(o_ptr + offsets, 2.0 * tl.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)

    @triton.jit
    def _copy_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(o_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)

    return _affine_kernel, _copy_kernel


_affine_kernel, _copy_kernel = _define_replay_kernels()


def _launch(kernel, x, out):
    kernel[(4,)](x, out, x.numel(), BLOCK=16)
    return out


def _in_kernels(x):
    """2x + 1 by a kernel, on a contiguous copy; the host casts the result there and back."""
    out = _launch(_affine_kernel, x.t().contiguous().t().contiguous(), torch.empty(x.shape))
    return out.double().float()


def _kernel_copy_then_numpy(x):
    copy = _launch(_copy_kernel, x, torch.empty_like(x))
    answer = torch.from_numpy(copy.numpy() * 2.0 + 1.0)
    return _launch(_copy_kernel, answer, torch.empty_like(x))


def _kernel_copy_then_torch(x):
    copy = _launch(_copy_kernel, x, torch.empty_like(x))
    return _launch(_copy_kernel, copy * 2.0 + 1.0, torch.empty_like(x))


@needs_interpreter
@pytest.mark.parametrize("launcher, follows, work", [(_in_kernels, True, 0), (_kernel_copy_then_numpy, False, 0),
                                                     (_kernel_copy_then_torch, True, 2 * 48)])
def test_a_replay_follows_the_kernels_not_the_host(launcher, follows, work):
    """The replay changes the input's signs after the call: what the kernels (and PyTorch's
    moves of data) computed follows; what NumPy computed from a kernel's copy is written
    again as it was; PyTorch arithmetic on the copy follows, and is counted."""
    from coursekit.kernel_replay import flip_signs, replay, watch_launcher

    x = torch.randn(6, 8)
    with watch_launcher([x], record=True) as watch:
        out = launcher(x)
        watch.finish(out)
    torch.testing.assert_close(out, 2 * x + 1)
    replayed = replay(watch.recording, 1234, [0])
    flipped = x * torch.from_numpy(flip_signs(1234, [x.shape])[0]).float()
    assert torch.allclose(replayed["outputs"], 2 * flipped + 1) == follows
    assert torch.allclose(replayed["outputs"], 2 * x + 1) == (not follows)
    assert replayed["host_work"] == work and replayed["changed"] == []
    assert watch.report()["launches"] == (1 if launcher is _in_kernels else 2)


@needs_interpreter
def test_a_replay_refuses_to_run_through_a_patched_library():
    import inspect

    from coursekit.kernel_replay import replay, watch_launcher

    x = torch.randn(6, 8)
    with watch_launcher([x], record=True) as watch:
        watch.finish(_in_kernels(x))
    original = inspect.getcallargs
    inspect.getcallargs = lambda *a, **k: original(*a, **k)
    try:
        replayed = replay(watch.recording, 1, [0])
    finally:
        inspect.getcallargs = original
    assert replayed["changed"] == ["inspect.getcallargs"] and replayed["outputs"] is None
    assert replay(watch.recording, 1, [0])["changed"] == []
