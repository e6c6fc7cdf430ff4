"""One launch of the tuned forward kernel for a profiler to measure.

    ncu --profile-from-start off --kernel-name regex:_tuned_forward_kernel \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \\
        python -m bookutils.profile_tuned

The kernel runs once to autotune (many launches, outside the profiled range:
--profile-from-start off waits for torch.cuda.profiler.start()), then once
inside it. It times nothing. book/flash/measured_io.md gives what the IO model
predicts for this launch."""
import torch

from bookutils.flash_tuned import flash_forward_tuned

BATCH, HEADS, N, HEAD_DIM = 4, 16, 4096, 64      # float16 Q, K, V and O


def main():
    q, k, v = (torch.randn(BATCH, HEADS, N, HEAD_DIM, device="cuda", dtype=torch.float16) for _ in range(3))
    flash_forward_tuned(q, k, v)          # autotuning: not profiled
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    flash_forward_tuned(q, k, v)          # the launch that is profiled
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
