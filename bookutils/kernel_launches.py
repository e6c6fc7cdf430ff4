"""Chapter 4's kernels as a GPU would launch them: each launcher called in the
configurations and input types it uses (its defaults, the benchmark's
configuration, the element types the book runs it with), recorded by
coursekit.compile_report without running any kernel. The compile report then
compiles exactly these launches for real GPUs: in the tests, in the book and in
`./scripts/benchmark --compile`."""
import torch

from coursekit.compile_report import Launch, record_launches, specialise
from bookutils import flash_tuned, staged_backward, triton_demo
from bookutils.benchmark import BATCH, HEAD_DIM, HEADS, TEACHING_BLOCKS
from bookutils.triton_kernels import flash_forward, standard_attention

BENCHMARK_BLOCKS = TEACHING_BLOCKS                 # bookutils.benchmark.triton_flash
BENCHMARK_SHAPE = (BATCH, HEADS, 1024, HEAD_DIM)  # batch, heads, n, d of the benchmark's forward table
RAGGED_N = 1000                      # a length that is a multiple of no block of the tuned kernel


def _empty(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype)      # never read: the kernels do not run


def book_launches():
    """The kernels of bookutils.triton_demo, .triton_kernels and .staged_backward."""
    f32, f16 = torch.float32, torch.float16
    with record_launches(execute=False) as log:
        triton_demo.program_ids(10, 4)
        for dtype in (f32, f16, torch.bfloat16):   # the book adds all three
            triton_demo.vector_add(_empty(100, dtype=dtype), _empty(100, dtype=dtype))
        triton_demo.softmax_rows_triton(_empty(5, 37))
        triton_demo.matmul_triton(_empty(100, 70), _empty(70, 50))
        x = _empty(1, 2, 100, 64)
        standard_attention(x, x, x)
        for dtype in (f32, f16):                    # the book's float32 and float16 runs, default blocks
            x = _empty(*BENCHMARK_SHAPE, dtype=dtype)
            for causal in (False, True):
                flash_forward(x, x, x, causal=causal)
        x = _empty(*BENCHMARK_SHAPE, dtype=f16)
        for causal in (False, True):                # the benchmark's configuration, a GPU's default blocks
            flash_forward(x, x, x, causal=causal, block_m=BENCHMARK_BLOCKS[0], block_n=BENCHMARK_BLOCKS[1])
        x, p = _empty(100, 64), _empty(100, 100)
        staged_backward.staged_backward(x, x, x, x, p, x)
    return log.distinct()


def tuned_launches(heads=(64, 128), causal=(False, True), lengths=(BENCHMARK_SHAPE[2], RAGGED_N),
                   dtype=torch.float16):
    """Every configuration the tuned kernel may be autotuned to, for head
    dimensions `heads`, causal or not, on lengths that are a multiple of every
    block (EVEN_N: no load is masked) and one that is not (the ragged last
    blocks are masked, which costs registers)."""
    kernel = flash_tuned._tuned_forward_kernel
    launches = []
    for head in heads:
        for n in lengths:
            x = _empty(BENCHMARK_SHAPE[0], BENCHMARK_SHAPE[1], n, head, dtype=dtype)
            lse = _empty(BENCHMARK_SHAPE[0], BENCHMARK_SHAPE[1], n)
            args = (x, x, x, x, lse, n, head, BENCHMARK_SHAPE[1], 1.0) + tuple(x.stride()[:3]) * 4
            for is_causal in causal:
                for block_m, block_n, warps, stages in flash_tuned.CONFIGS:
                    spec = specialise(kernel, *args, HEAD=head, CAUSAL=is_causal, BLOCK_M=block_m,
                                      BLOCK_N=block_n, EVEN_N=n % block_m == 0, EVEN_D=True, num_warps=warps,
                                      num_stages=stages)
                    launches.append(Launch(kernel, spec))
    return launches


def solution_launches(kernels):
    """The instructor's backward and decoding kernels (autograde.solution_kernels)
    as the benchmark, and the grader on a GPU, launch them: float16, causal or not,
    grouped-query heads for decoding. (Float32 is what they get in the interpreter.)"""
    with record_launches(execute=False) as log:
        x = _empty(*BENCHMARK_SHAPE, dtype=torch.float16)
        lse = _empty(*BENCHMARK_SHAPE[:3])
        for causal in (False, True):
            kernels.flash_attention_backward(x, x, x, x, lse, x, causal)
        q, cache = _empty(8, 32, 128, dtype=torch.float16), _empty(8, 8, 4096, 128, dtype=torch.float16)
        kernels.decode_attention(q, cache, cache, torch.full((8,), 4096, dtype=torch.int32))
    return log.distinct()
