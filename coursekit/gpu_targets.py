"""The four GPUs that Chapter 4's kernels are compiled for, with the published
per-multiprocessor limits that decide how many programs of a kernel can be
resident at once (theoretical occupancy).

Sources of the numbers:
- NVIDIA, CUDA C++ Programming Guide, "Technical Specifications per Compute
  Capability": resident warps, resident blocks, 32-bit registers and shared
  memory per multiprocessor, shared memory per block (opt-in), registers per thread.
- NVIDIA, CUDA Occupancy Calculator (the spreadsheet that ships with Nsight
  Compute): registers are allocated per warp in units of 256, the warps a
  register budget allows are rounded down to a multiple of 4, shared memory is
  allocated in units of 256 bytes (compute capability 7.5) or 128 bytes (8.0 on).
- NVIDIA, CUDA C++ Programming Guide, "Shared Memory" of the compute
  capabilities 8.x and 9.0 sections and the device attribute
  cudaDevAttrReservedSharedMemoryPerBlock: the driver reserves 1 KiB of shared
  memory per block from compute capability 8.0 on (the per-block opt-in limit is
  the multiprocessor's shared memory less that).
Occupancy assumes the largest shared-memory carve-out (shared_per_sm), which the
driver picks for a kernel that needs it."""
from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class GPUTargetSpec:
    name: str                     # a GPU of that compute capability, for readers
    capability: int               # 75 for compute capability 7.5
    max_warps_per_sm: int
    max_blocks_per_sm: int
    shared_per_sm: int            # bytes, with the largest shared-memory carve-out
    shared_per_block: int         # bytes a block may opt in to
    reserved_shared_per_block: int
    shared_unit: int              # shared memory allocation unit, bytes
    registers_per_sm: int = 64 * KIB
    max_registers_per_thread: int = 255
    register_unit: int = 256      # registers are allocated per warp in units of this many
    warp_granularity: int = 4     # a register budget admits warps in multiples of this

    @property
    def arch(self):
        """ptxas's name for it; Triton compiles compute capability 9.0 as sm_90a (warpgroup MMA needs it)."""
        return f"sm_{self.capability}" + ("a" if self.capability == 90 else "")


TARGETS = {
    "T4": GPUTargetSpec("T4", 75, max_warps_per_sm=32, max_blocks_per_sm=16, shared_per_sm=64 * KIB,
                        shared_per_block=64 * KIB, reserved_shared_per_block=0, shared_unit=256),
    "A100": GPUTargetSpec("A100", 80, max_warps_per_sm=64, max_blocks_per_sm=32, shared_per_sm=164 * KIB,
                          shared_per_block=163 * KIB, reserved_shared_per_block=KIB, shared_unit=128),
    "L4": GPUTargetSpec("L4", 89, max_warps_per_sm=48, max_blocks_per_sm=24, shared_per_sm=100 * KIB,
                        shared_per_block=99 * KIB, reserved_shared_per_block=KIB, shared_unit=128),
    "H100": GPUTargetSpec("H100", 90, max_warps_per_sm=64, max_blocks_per_sm=32, shared_per_sm=228 * KIB,
                          shared_per_block=227 * KIB, reserved_shared_per_block=KIB, shared_unit=128),
}


def _round_up(x, unit):
    return -(-x // unit) * unit


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int            # resident programs per multiprocessor
    warps_per_sm: int
    max_warps_per_sm: int
    limited_by: str               # "warps", "blocks", "registers", "shared memory", or ties joined by "and"
    by_limit: dict                # blocks each limit alone would allow

    @property
    def fraction(self):
        return self.warps_per_sm / self.max_warps_per_sm


def occupancy(target, registers, shared_bytes, num_warps):
    """Theoretical occupancy of a kernel using `registers` per thread and
    `shared_bytes` of shared memory per program of `num_warps` warps, as NVIDIA's
    occupancy calculator computes it (before any limit the launch itself sets)."""
    spec = TARGETS[target] if isinstance(target, str) else target
    by_limit = {"warps": spec.max_warps_per_sm // num_warps, "blocks": spec.max_blocks_per_sm}
    if registers > spec.max_registers_per_thread:
        by_limit["registers"] = 0
    elif registers > 0:
        per_warp = _round_up(registers * 32, spec.register_unit)
        warps = spec.registers_per_sm // per_warp // spec.warp_granularity * spec.warp_granularity
        by_limit["registers"] = warps // num_warps
    if shared_bytes > spec.shared_per_block:
        by_limit["shared memory"] = 0
    elif shared_bytes > 0:
        per_block = _round_up(shared_bytes + spec.reserved_shared_per_block, spec.shared_unit)
        by_limit["shared memory"] = spec.shared_per_sm // per_block
    blocks = min(by_limit.values())
    limited_by = " and ".join(name for name, allowed in by_limit.items() if allowed == blocks)   # every tie
    return Occupancy(blocks, blocks * num_warps, spec.max_warps_per_sm, limited_by, by_limit)
