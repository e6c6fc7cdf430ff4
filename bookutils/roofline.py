"""The roofline and the IO model of Chapter 4: the published peak rates of one GPU,
the time each of its units needs for a step's work, and the elements one head of
attention moves between slow and fast memory."""

# NVIDIA H100 SXM5, published peak rates (dense, without structured sparsity)
TENSOR_FLOPS = 989e12    # FP16/BF16 matrix products on the tensor cores, FLOP/s
FP32_FLOPS = 67e12       # float32 arithmetic on the other cores, FLOP/s
EXP_RATE = 3.9e12        # special functions such as exp, evaluations per second
HBM_BYTES = 3.35e12      # HBM3 bandwidth, bytes/s
L2_BYTES = 50e6          # L2 cache, shared by all multiprocessors
SMS = 132                # streaming multiprocessors
BYTES = 2                # bytes per number: half precision

SOFTMAX_FP32_OPS = 4     # per entry of a softmax: max, subtract, sum, divide (plus one exp)


def intensity(flops, elements_moved, b=BYTES):
    """FLOPs per byte moved to and from HBM."""
    return flops / (b * elements_moved)


def unit_times(matmul_flops, fp32_ops, exps, elements, b=BYTES, hbm_bytes=HBM_BYTES):
    """Seconds each resource needs for a step's work at its peak rate (hbm_bytes: bytes per second)."""
    return {"tensor": matmul_flops / TENSOR_FLOPS, "fp32": fp32_ops / FP32_FLOPS,
            "exp": exps / EXP_RATE, "HBM": b * elements / hbm_bytes}


def busiest(times):
    """The resource that needs the most time: the one that bounds the step."""
    return max(times, key=times.get)


def model_traffic(n, d, block_rows):
    """Elements moved between slow and fast memory in the IO model, for one head:
    (standard attention, tiled attention with block_rows queries per block)."""
    standard = ((2 * n * d + n * n)        # read Q, K; write S
                + (n * n + n * n)          # read S; write P
                + (n * n + n * d + n * d)) # read P, V; write O
    query_blocks = (n + block_rows - 1) // block_rows   # ceil(n / block_rows)
    tiled = (n * d                          # read Q, one block at a time
             + query_blocks * 2 * n * d     # every query block reads all of K and V
             + n * d)                       # write O
    return standard, tiled
