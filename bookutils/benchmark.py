"""Benchmark of the FlashAttention kernels on this machine.

With a CUDA GPU: the rate of one large float16 matrix product by torch.matmul,
measured first as the run's matrix-product peak; then TFLOP/s (and their share of
that peak) and peak memory of the chapter's teaching kernel, its tuned version
(bookutils.flash_tuned), PyTorch's scaled_dot_product_attention with its
FlashAttention backend pinned, and naive PyTorch attention; then forward plus
backward TFLOP/s and decoding latency against that backend (which is given the
unexpanded grouped-query caches with enable_gqa=True, or, where it refuses them,
caches expanded to one head per query head, and the row's method says so). Without one: the peak CPU memory of the same
computations (the kernels under Triton's interpreter). The backward and decoding
kernels measured are the instructor's solutions of the chapter's exercises: where
the course's grading package is absent (the student release) their rows are left
out, and the output says why. So are the tuned backward (autograde.tuned_backward,
another answer to that exercise), timed with the tuned forward as one more
forward + backward row, and the tuned decoding step (autograde.tuned_decode), one
more decoding row. `--head-dim D` sets the head width of the forward
and forward + backward tables (64 by default; the decoding step keeps Mistral 7B's
128). `--save FILE` writes every row, with the device, driver, library versions,
date and commit, as JSON (bookutils.results); `--compile` prints instead what
Triton's compiler makes of every kernel for a T4, an A100, an L4 and an H100
(coursekit.compile_report), which needs no GPU.
Run as `python -m bookutils.benchmark` (the README's `./scripts/benchmark`). It
imports only torch, triton, numpy and the course's own packages, so a GPU machine
can run a copy of the tree with PYTHONPATH alone."""
import argparse
import importlib
import math

import torch

from coursekit.memory import traced_peak
from bookutils.backward import backward_flops, forward_flops
from bookutils.flash_tuned import MAX_HEAD, flash_forward_tuned
from bookutils.triton_kernels import DEVICE, default_blocks, flash_forward

# The benchmark's shapes, one place for the code, the book and the compile report
# (bookutils.kernel_launches): batch, heads and head width of the GPU tables, and
# the teaching kernel's blocks B_r x B_c in them.
BATCH, HEADS, HEAD_DIM = 4, 16, 64
TEACHING_BLOCKS = default_blocks("cuda", torch.float16)

NO_SOLUTIONS = ("the backward and decoding kernels are the solutions of Chapter 4's exercises: they are "
                "measured only where the course's grading package is installed")


NO_TUNED_BACKWARD = ("the tuned backward kernel answers Chapter 4's Exercise 4: it is measured only where the "
                     "course's grading package is installed")
TUNED_PAIR = "tuned forward, tuned backward"


def _instructor_only(module, name, why):
    """(module.name, None), or (None, why) where the grading package is absent (the student
    release). Imports no notebook reader: a GPU machine with PYTHONPATH alone runs it."""
    try:
        return getattr(importlib.import_module(module), name), None
    except ImportError:
        return None, why


def tuned_backward_attention():
    """(attention, None), attention(q, k, v, causal) differentiable through the tuned
    forward and the instructor's tuned backward, or (None, why)."""
    return _instructor_only("autograde.tuned_backward", "tuned_attention", NO_TUNED_BACKWARD)


NO_TUNED_DECODE = ("the tuned decoding kernels answer Chapter 4's Exercise 5: they are measured only where the "
                   "course's grading package is installed")
TUNED_DECODE = "instructor's tuned split-K decoding"


def tuned_decoding():
    """(decode, None), decode(q, k_cache, v_cache, cache_lens) the instructor's tuned
    decoding step, or (None, why)."""
    return _instructor_only("autograde.tuned_decode", "tuned_decode", NO_TUNED_DECODE)


def solution_kernels():
    """(kernels, None) with the instructor's backward and decoding kernels, or
    (None, why) where they are not available."""
    try:
        from autograde.solution_kernels import chapter4_kernels
    except ImportError:
        return None, NO_SOLUTIONS
    return chapter4_kernels(), None


def naive_attention(q, k, v, causal=False):
    """softmax(QK^T / sqrt(d)) V with the full score matrix in memory."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def sdpa_flash(q, k, v, causal=False):
    """PyTorch's fused attention, restricted to its FlashAttention backend (no silent fallback)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def triton_flash(q, k, v, causal=False):
    return flash_forward(q, k, v, causal=causal, block_m=TEACHING_BLOCKS[0], block_n=TEACHING_BLOCKS[1])[0]


def triton_flash_tuned(q, k, v, causal=False):
    return flash_forward_tuned(q, k, v, causal=causal)[0]


GPU_METHODS = {"Triton kernel (this chapter)": triton_flash,
               "Triton kernel, tuned": triton_flash_tuned,
               "SDPA, FLASH_ATTENTION backend": sdpa_flash,
               "naive PyTorch": naive_attention}


def with_backward(forward, backward):
    """attention(q, k, v, causal) differentiable: `forward` returns (O, logsumexp),
    `backward` the instructor's flash_attention_backward."""
    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal):
            o, lse = forward(q, k, v, causal=causal)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal = causal
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = backward(q, k, v, o, lse, do, ctx.causal)
            return dq, dk, dv, None

    return Attention.apply


def attention_tflops(batch, heads, n, d, causal, seconds):
    """4 · batch · heads · n² · d floating-point operations (QK^T and PV), halved when causal."""
    flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
    return flops / seconds / 1e12


def gpu_rows(sizes=(512, 1024, 2048, 4096, 8192), batch=BATCH, heads=HEADS, d=HEAD_DIM, dtype=torch.float16,
             causal=False):
    """One dict per (method, n): milliseconds, TFLOP/s and peak extra memory in MiB."""
    import triton.testing

    rows = []
    for n in sizes:
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype) for _ in range(3))
        for name, fn in GPU_METHODS.items():
            try:
                ms = triton.testing.do_bench(lambda: fn(q, k, v, causal))
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                fn(q, k, v, causal)
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            except torch.OutOfMemoryError:
                ms, peak = float("nan"), float("nan")
                torch.cuda.empty_cache()
            rows.append({"method": name, "n": n, "ms": ms, "peak_mib": peak,
                         "tflops": attention_tflops(batch, heads, n, d, causal, ms / 1e3)})
    return rows


def sdpa_flash_decode(q, k_cache, v_cache, enable_gqa=True):
    """One decoding step by SDPA's FlashAttention backend: q (batch, heads, d) against
    caches (batch, kv_heads, length, d). With enable_gqa (PyTorch 2.5 and later) the
    backend reads the grouped-query caches as they are, each key-value head serving
    its group of query heads; without it, the caches must already be expanded to one
    head per query head."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    extra = {"enable_gqa": True} if enable_gqa else {}
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k_cache, v_cache, **extra)[:, :, 0]


SDPA_DECODE = "SDPA, FLASH_ATTENTION backend, enable_gqa"


def sdpa_decode_call(q, k_cache, v_cache):
    """(method name, call) for SDPA's decoding step: the unexpanded caches with
    enable_gqa=True, or, where this PyTorch or this backend refuses them (tried once
    here, outside any timing), caches expanded to one head per query head with
    repeat_interleave, which reads the group's cache once per query head; the name
    says which, and why."""
    try:
        sdpa_flash_decode(q, k_cache, v_cache)
        return SDPA_DECODE, lambda: sdpa_flash_decode(q, k_cache, v_cache)
    except (RuntimeError, TypeError) as err:          # TypeError: a PyTorch without enable_gqa
        group = q.shape[1] // k_cache.shape[1]
        expanded = [c.repeat_interleave(group, dim=1) for c in (k_cache, v_cache)]
        why = str(err).strip().splitlines()[0][:60] if str(err).strip() else type(err).__name__
        name = f"SDPA, FLASH_ATTENTION backend, caches expanded {group}x (enable_gqa refused: {why})"
        return name, lambda: sdpa_flash_decode(q, *expanded, enable_gqa=False)


def training_rows(kernels, sizes=(1024, 2048, 4096, 8192, 16384), batch=BATCH, heads=HEADS, d=HEAD_DIM,
                  dtype=torch.float16, causal=False, device="cuda", timer=None, tuned=None):
    """Forward + backward: one dict per (method, n) with milliseconds and TFLOP/s,
    counting the backward's recomputation of QK^T (3.5 times the forward's FLOPs).
    tuned: the tuned pair (tuned_backward_attention), a row of its own when given."""
    timer = timer or _do_bench
    methods = {"SDPA, FLASH_ATTENTION backend": sdpa_flash}
    if kernels is not None:
        def teaching(q, k, v, causal):
            return flash_forward(q, k, v, causal=causal, block_m=TEACHING_BLOCKS[0], block_n=TEACHING_BLOCKS[1])
        methods["teaching forward, instructor's backward"] = with_backward(teaching, kernels.flash_attention_backward)
        methods["tuned forward, instructor's backward"] = with_backward(flash_forward_tuned,
                                                                        kernels.flash_attention_backward)
    if tuned is not None:
        methods[TUNED_PAIR] = tuned
    rows = []
    for n in sizes:
        q, k, v = (torch.randn(batch, heads, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        do = torch.randn(batch, heads, n, d, device=device, dtype=dtype)
        flops = batch * heads * (forward_flops(n, d) + backward_flops(n, d)) * (0.5 if causal else 1.0)
        for name, fn in methods.items():
            def step(fn=fn):
                return torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)
            ms = timer(step)
            rows.append({"method": name, "n": n, "ms": ms, "tflops": flops / (ms / 1e3) / 1e12})
    return rows


def decode_rows(kernels, lengths=(1024, 8192, 32768, 131072), batches=(1, 8), heads=32, kv_heads=8, d=128,
                dtype=torch.float16, device="cuda", timer=None, tuned=None):
    """One decoding step (one query per sequence, grouped-query heads as in Mistral 7B):
    one dict per (method, batch, cache length) with microseconds. tuned: the tuned
    decoding step (tuned_decoding), a row of its own when given."""
    timer = timer or _do_bench
    rows = []
    for batch in batches:
        for length in lengths:
            q = torch.randn(batch, heads, d, device=device, dtype=dtype)
            k_cache, v_cache = (torch.randn(batch, kv_heads, length, d, device=device, dtype=dtype) for _ in range(2))
            name, call = sdpa_decode_call(q, k_cache, v_cache)
            calls = {name: call}
            lens = torch.full((batch,), length, device=device, dtype=torch.int32)
            if kernels is not None:
                calls["instructor's split-K kernels"] = lambda: kernels.decode_attention(q, k_cache, v_cache, lens)
            if tuned is not None:
                calls[TUNED_DECODE] = lambda: tuned(q, k_cache, v_cache, lens)
            for name, call in calls.items():
                rows.append({"method": name, "batch": batch, "length": length, "us": 1e3 * timer(call)})
            del calls
    return rows


def matmul_peak(size=8192, dtype=torch.float16, timer=None):
    """The matrix-product rate of this GPU in this run: one size x size x size
    product by torch.matmul (2 size^3 FLOPs), as a row with milliseconds and TFLOP/s."""
    timer = timer or _do_bench
    a, b = (torch.randn(size, size, device="cuda", dtype=dtype) for _ in range(2))
    ms = timer(lambda: a @ b)
    return {"method": f"torch.matmul, {str(dtype).removeprefix('torch.')}", "n": size, "ms": ms,
            "tflops": 2 * size**3 / (ms / 1e3) / 1e12}


def _do_bench(fn):
    import triton.testing

    return triton.testing.do_bench(fn)


def cpu_backward_rows(kernels, sizes=(128, 256, 512), d=64):
    """Peak extra CPU memory (bytes) of one head's backward pass: the instructor's
    kernels under the interpreter against autograd through naive PyTorch attention."""
    def autograd_backward(q, k, v, o, lse, do):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(naive_attention(*leaves), leaves, do)

    methods = {"autograd, naive PyTorch": autograd_backward,
               "instructor's kernels, interpreted": kernels.flash_attention_backward}
    rows = []
    for n in sizes:
        q, k, v, do = (torch.randn(1, 1, n, d) for _ in range(4))
        o, lse = flash_forward(q, k, v)
        for name, fn in methods.items():
            fn(q[..., :16, :], k[..., :16, :], v[..., :16, :], o[..., :16, :], lse[..., :16], do[..., :16, :])
            _, peak = traced_peak(fn, q, k, v, o, lse, do)
            rows.append({"method": name, "n": n, "peak_bytes": peak, "scores_bytes": 4 * n * n})
    return rows


def cpu_rows(sizes=(128, 256, 512), d=64):
    """Peak extra CPU memory (bytes) of one head of attention, per method and n."""
    methods = {"Triton kernel, interpreted": lambda q, k, v: flash_forward(q, k, v)[0],
               "naive PyTorch": naive_attention}
    small = torch.randn(1, 1, 16, d)
    for fn in methods.values():           # first calls load code; keep that out of the peaks
        fn(small, small, small)
    rows = []
    for n in sizes:
        q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
        for name, fn in methods.items():
            _, peak = traced_peak(fn, q, k, v)
            rows.append({"method": name, "n": n, "peak_bytes": peak, "scores_bytes": 4 * n * n})
    return rows


def _print_table(rows, columns):
    print("  ".join(f"{title:>{width}}" for title, _, width in columns))
    for row in rows:
        print("  ".join(f"{fmt(row):>{width}}" for _, fmt, width in columns))


FORWARD_COLUMNS = [("method", lambda r: r["method"], 30), ("n", lambda r: r["n"], 6),
                   ("ms", lambda r: f"{r['ms']:.3f}", 9), ("TFLOP/s", lambda r: f"{r['tflops']:.1f}", 8),
                   ("of matmul", lambda r: f"{r['matmul_share']:.0%}", 9),
                   ("peak MiB", lambda r: f"{r['peak_mib']:.1f}", 9)]
MATMUL_COLUMNS = [("method", lambda r: r["method"], 30), ("n", lambda r: r["n"], 6),
                  ("ms", lambda r: f"{r['ms']:.3f}", 9), ("TFLOP/s", lambda r: f"{r['tflops']:.1f}", 8)]
TRAINING_COLUMNS = [("method", lambda r: r["method"], 38), ("n", lambda r: r["n"], 6),
                    ("ms", lambda r: f"{r['ms']:.3f}", 9), ("TFLOP/s", lambda r: f"{r['tflops']:.1f}", 8)]
DECODE_COLUMNS = [("method", lambda r: r["method"], 42), ("batch", lambda r: r["batch"], 6),
                  ("cache", lambda r: r["length"], 7), ("us", lambda r: f"{r['us']:.1f}", 9)]
CPU_COLUMNS = [("method", lambda r: r["method"], 34), ("n", lambda r: r["n"], 6),
               ("peak KiB", lambda r: f"{r['peak_bytes'] / 1024:.0f}", 10),
               ("n x n scores KiB", lambda r: f"{r['scores_bytes'] / 1024:.0f}", 17)]


def compile_table():
    """What Triton's compiler makes of every kernel for the four GPUs, printed."""
    from coursekit.compile_report import compile_reports, render
    from bookutils.kernel_launches import book_launches, solution_launches, tuned_launches

    kernels, why = solution_kernels()
    launches = book_launches() + tuned_launches() + (solution_launches(kernels) if kernels is not None else [])
    print(render(compile_reports(launches)))
    if kernels is None:
        print(f"\nSolution kernels left out: {why}.")


def main(argv=None):
    from bookutils import results

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--causal", action="store_true", help="causal attention (FLOPs halved)")
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM, metavar="D",
                        help=f"head width d of the forward and forward + backward tables (default {HEAD_DIM})")
    parser.add_argument("--save", metavar="FILE",
                        help="also write every row, the device, the versions and the commit as JSON")
    parser.add_argument("--no-decode", action="store_true",
                        help="leave out the decoding table (its rows depend on neither --head-dim nor --causal)")
    parser.add_argument("--compile", action="store_true",
                        help="print the compile report of every kernel for T4, A100, L4 and H100 instead")
    args = parser.parse_args(argv)
    if args.compile:
        compile_table()
        return
    d = args.head_dim
    if d < 1 or (DEVICE == "cuda" and d > MAX_HEAD):
        parser.error(f"--head-dim must be between 1 and {MAX_HEAD} (the tuned kernel's widest head), got {d}")
    tables = {}
    kernels, why = solution_kernels()
    tuned, why_tuned = tuned_backward_attention()
    decode, why_decode = tuned_decoding()
    shapes = f"float16, batch {BATCH}, {HEADS} heads, d = {d}"
    if DEVICE == "cuda":
        print(f"GPU: {torch.cuda.get_device_name()}; matrix-product peak of this run:")
        tables["matmul"] = [matmul_peak()]
        _print_table(tables["matmul"], MATMUL_COLUMNS)
        peak = tables["matmul"][0]["tflops"]
        print(f"\nForward: {shapes}, causal={args.causal}; 'of matmul' is each row's share of {peak:.1f} TFLOP/s")
        tables["forward"] = gpu_rows(d=d, causal=args.causal)
        for row in tables["forward"]:
            row["matmul_share"] = row["tflops"] / peak
        _print_table(tables["forward"], FORWARD_COLUMNS)
        print(f"\nForward + backward: {shapes}, causal={args.causal}")
        tables["forward_backward"] = training_rows(kernels, d=d, causal=args.causal, tuned=tuned)
        _print_table(tables["forward_backward"], TRAINING_COLUMNS)
        if not args.no_decode:
            print("\nOne decoding step: float16, 32 query heads sharing 8 key-value heads, d = 128, full caches")
            tables["decode"] = decode_rows(kernels, tuned=decode)
            _print_table(tables["decode"], DECODE_COLUMNS)
    else:
        print(f"No GPU: peak CPU memory of one head (d = {d}, float32); the kernel runs in Triton's interpreter.")
        tables["cpu_memory"] = cpu_rows(d=d)
        _print_table(tables["cpu_memory"], CPU_COLUMNS)
        if kernels is not None:
            print(f"\nBackward pass: peak CPU memory of one head (d = {d}, float32).")
            tables["cpu_backward_memory"] = cpu_backward_rows(kernels, d=d)
            _print_table(tables["cpu_backward_memory"], CPU_COLUMNS)
    if kernels is None:
        print(f"\nBackward and decoding rows left out: {why}.")
    if tuned is None and DEVICE == "cuda":
        print(f"\nThe '{TUNED_PAIR}' row left out: {why_tuned}.")
    if decode is None and DEVICE == "cuda" and not args.no_decode:
        print(f"\nThe '{TUNED_DECODE}' rows left out: {why_decode}.")
    if args.save:
        results.save(args.save, tables, {"causal": args.causal, "dtype": "float16" if DEVICE == "cuda" else "float32",
                                          "head_dim": d, "solution_kernels": kernels is not None,
                                          "tuned_backward": tuned is not None, "tuned_decode": decode is not None})
        print(f"\nSaved to {args.save}.")


if __name__ == "__main__":
    main()
