"""Benchmark of the FlashAttention kernel. With a CUDA GPU: TFLOP/s and peak
memory of the Triton kernel, PyTorch's scaled_dot_product_attention with its
FlashAttention backend pinned, and naive PyTorch attention. Without one: the peak
CPU memory of the same computations (the kernel under Triton's interpreter).
Run as `python -m bookutils.benchmark` (the README's `./scripts/benchmark`)."""
import argparse
import math

import torch

from coursekit.memory import traced_peak
from bookutils.triton_kernels import DEVICE, flash_forward


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
    return flash_forward(q, k, v, causal=causal, block_m=64, block_n=64)[0]


GPU_METHODS = {"Triton kernel (this chapter)": triton_flash,
               "SDPA, FLASH_ATTENTION backend": sdpa_flash,
               "naive PyTorch": naive_attention}


def attention_tflops(batch, heads, n, d, causal, seconds):
    """4·B·H·N²·D floating-point operations (QK^T and PV), halved when causal."""
    flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
    return flops / seconds / 1e12


def gpu_rows(sizes=(512, 1024, 2048, 4096, 8192), batch=4, heads=16, d=64, dtype=torch.float16, causal=False):
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--causal", action="store_true", help="causal attention (FLOPs halved)")
    args = parser.parse_args(argv)
    if DEVICE == "cuda":
        print(f"GPU: {torch.cuda.get_device_name()}; float16, batch 4, 16 heads, d = 64, causal={args.causal}")
        _print_table(gpu_rows(causal=args.causal), [
            ("method", lambda r: r["method"], 30), ("n", lambda r: r["n"], 6),
            ("ms", lambda r: f"{r['ms']:.3f}", 9), ("TFLOP/s", lambda r: f"{r['tflops']:.1f}", 8),
            ("peak MiB", lambda r: f"{r['peak_mib']:.1f}", 9)])
    else:
        print("No GPU: peak CPU memory of one head (d = 64, float32); the kernel runs in Triton's interpreter.")
        _print_table(cpu_rows(), [
            ("method", lambda r: r["method"], 28), ("n", lambda r: r["n"], 6),
            ("peak KiB", lambda r: f"{r['peak_bytes'] / 1024:.0f}", 10),
            ("n x n scores KiB", lambda r: f"{r['scores_bytes'] / 1024:.0f}", 17)])


if __name__ == "__main__":
    main()
