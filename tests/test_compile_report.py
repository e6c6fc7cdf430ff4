"""Chapter 4's kernels on real GPUs, proven without one: every kernel of
bookutils, the tuned kernel and the instructor's solution kernels, launched as
their launchers launch them (bookutils.kernel_launches), compile for a T4, an
A100, an L4 and an H100 with Triton's own compiler; nothing spills on the A100
or the H100; shared memory fits each GPU; the benchmark's forward kernel and
every configuration of the tuned kernel use the H100's warpgroup MMA. Kernels
that only Triton's interpreter accepts are reported as not compiling, with the
line. Plus the report's own parts: specialisation, occupancy, cache, rendering.

The compiles run once per test run (two processes at a time); set
COURSEKIT_COMPILE_CACHE to a folder to keep them between runs."""
import pytest
import torch

from coursekit import compile_report as cr
from coursekit.binary_report import sass_opcodes, tensor_core_instructions
from coursekit.compile_worker import backend_problem
from coursekit.gpu_targets import TARGETS, occupancy
from coursekit.triton_env import triton_device

DEVICE = triton_device(quiet=True)

NO_BACKEND = backend_problem()
needs_backend = pytest.mark.skipif(NO_BACKEND is not None, reason=str(NO_BACKEND))
FAST = ("A100", "H100")          # the GPUs the grader and the tuned kernel care about


def _failures(reports, check, targets=cr.TARGET_NAMES):
    return [f"{r.kernel} [{r.spec.label()}] on {t}: {check(r[t])}" for r in reports for t in targets
            if check(r[t])]


@pytest.fixture(scope="module")   # module: its tests then share one worker, and it is compiled once
def chapter4_reports():
    """{'book': [...], 'tuned': [...], 'solutions': [...]} KernelReports for all four targets."""
    from autograde.solution_kernels import chapter4_kernels
    from bookutils import kernel_launches as kl

    groups = {"book": kl.book_launches(), "tuned": kl.tuned_launches(),
              "solutions": kl.solution_launches(chapter4_kernels())}
    everything = [launch for launches in groups.values() for launch in launches]
    reports = cr.compile_reports(everything, workers=2)
    out, start = {}, 0
    for name, launches in groups.items():
        out[name] = reports[start:start + len(launches)]
        start += len(launches)
    return out


@needs_backend
@pytest.mark.parametrize("group", ["book", "tuned", "solutions"])
def test_every_kernel_compiles_for_t4_a100_l4_and_h100(chapter4_reports, group):
    reports = chapter4_reports[group]
    assert reports, "no launches recorded"
    assert not _failures(reports, lambda t: None if t.compiles else t.error), cr.render(reports)


@needs_backend
@pytest.mark.parametrize("group", ["book", "tuned", "solutions"])
def test_nothing_spills_on_a100_or_h100(chapter4_reports, group):
    reports = chapter4_reports[group]
    spills = _failures(reports, lambda t: t.spills and f"{t.spill_stores} bytes stored, {t.spill_loads} loaded",
                       FAST)
    assert not spills, "\n".join(spills)


def _over(t):
    return t.shared > t.shared_limit and f"{t.shared} bytes of shared memory, over {t.shared_limit}"


@needs_backend
@pytest.mark.parametrize("group", ["book", "solutions"])
def test_shared_memory_fits_every_target(chapter4_reports, group):
    over = _failures(chapter4_reports[group], _over)
    assert not over, "\n".join(over)


@needs_backend
def test_tuned_configurations_fit_or_the_autotuner_skips_them(chapter4_reports):
    """Every configuration fits an A100, an L4 and an H100. A T4 allows a program
    64 KiB: Triton's autotuner times a configuration that cannot launch there as
    infinitely slow, so each launch needs one configuration that fits."""
    from bookutils.flash_tuned import CONFIGS

    reports = chapter4_reports["tuned"]
    over = _failures(reports, _over, ("A100", "L4", "H100"))
    assert not over, "\n".join(over)
    per_launch = {}
    for r in reports:
        c = dict(r.spec.constexprs)
        per_launch.setdefault((c["HEAD"], c["CAUSAL"], c["EVEN_N"]), []).append(not _over(r["T4"]))
    assert all(len(fits) == len(CONFIGS) and any(fits) for fits in per_launch.values()), per_launch
    too_big = {dict(r.spec.constexprs)["BLOCK_M"] for r in reports if _over(r["T4"])}
    assert too_big <= {128}, "only 128-row configurations may be too big for a T4 (bookutils/flash_tuned.py says so)"
    runs_on_t4 = [r["T4"] for r in reports if dict(r.spec.constexprs)["HEAD"] == 128 and not _over(r["T4"])]
    assert runs_on_t4 and all(t.spill_stores > 2048 for t in runs_on_t4), \
        "bookutils/flash_tuned.py says the configuration a T4 runs at d = 128 spills several KiB"


@needs_backend
def test_benchmark_forward_kernel_uses_warpgroup_mma_on_h100(chapter4_reports):
    from bookutils.kernel_launches import BENCHMARK_BLOCKS

    benchmark = [r for r in chapter4_reports["book"] if r.kernel == "_flash_forward_kernel"
                 and dict(r.spec.constexprs)["BLOCK_M"] == BENCHMARK_BLOCKS[0]]
    assert len(benchmark) == 2                     # causal and not
    for report in benchmark:
        assert report["H100"].mma.get("HGMMA", 0) > 0, report.render()
        assert report["A100"].mma.get("HMMA", 0) > 0 and "HGMMA" not in report["A100"].mma


def test_tuned_launches_cover_causal_and_ragged_lengths():
    """The screen compiles each configuration in every variant the kernel has:
    causal or not, with and without masked (ragged) key blocks, for d = 64 and 128."""
    from bookutils import kernel_launches as kl
    from bookutils.flash_tuned import CONFIGS

    variants = {}
    for launch in kl.tuned_launches():
        c = dict(launch.spec.constexprs)
        variants.setdefault((c["HEAD"], c["CAUSAL"], c["EVEN_N"]), set()).add(
            (c["BLOCK_M"], c["BLOCK_N"], launch.spec.num_warps, launch.spec.num_stages))
    assert set(variants) == {(h, causal, even) for h in (64, 128) for causal in (False, True)
                             for even in (False, True)}
    assert all(configs == set(CONFIGS) for configs in variants.values())


@needs_backend
def test_every_tuned_configuration_uses_warpgroup_mma_on_h100(chapter4_reports):
    without = [r.spec.label() for r in chapter4_reports["tuned"] if r["H100"].mma_kind != "HGMMA"]
    assert not without, without


@needs_backend
def test_tuned_kernel_compiles_in_bfloat16_without_spills_with_warpgroup_mma():
    """bfloat16 inputs, in the variant that needs the most registers (ragged, causal):
    every configuration compiles for an A100 and an H100 without spills, with HGMMA on
    the H100."""
    from bookutils import kernel_launches as kl

    reports = cr.compile_reports(kl.tuned_launches(causal=(True,), lengths=(kl.RAGGED_N,), dtype=torch.bfloat16),
                                 targets=FAST, workers=2)
    assert reports and all("bf16" in r.spec.label() for r in reports), [r.spec.label() for r in reports]
    problems = _failures(reports, lambda t: t.error if not t.compiles else (t.spills and "spills"), FAST)
    assert not problems, "\n".join(problems) + "\n" + cr.render(reports)
    assert all(r["H100"].mma_kind == "HGMMA" for r in reports), cr.render(reports)


@needs_backend
def test_benchmark_command_prints_the_compile_table(chapter4_reports, capsys):
    """`./scripts/benchmark --compile`: the same launches, answered from this test run's results."""
    from bookutils import benchmark

    benchmark.main(["--compile"])
    out = capsys.readouterr().out
    for report in [r for reports in chapter4_reports.values() for r in reports]:
        assert f"{report.kernel} [{report.spec.label()}]" in out
    assert out.count("H100 sm_90a") == sum(len(reports) for reports in chapter4_reports.values())


@needs_backend
def test_the_books_default_blocks_get_no_warpgroup_mma_on_h100(chapter4_reports):
    """What the book explains: 32-row blocks are too small for a warpgroup instruction (64 rows)."""
    default = [r for r in chapter4_reports["book"] if r.kernel == "_flash_forward_kernel"
               and dict(r.spec.constexprs)["BLOCK_M"] == 32]
    assert default and all(r["H100"].mma_kind == "HMMA" for r in default)


# ---------------------------------------------------------------- planted kernels

@pytest.fixture(scope="module")
def planted_reports():
    from tests import planted_kernels as pk

    x = torch.randn(100, device=DEVICE)
    with cr.record_launches(execute=False) as launches:      # on a GPU the planted ones would not compile
        for kernel in (pk.numpy_exp_kernel, pk.plain_helper_kernel, pk.nested_numpy_kernel, pk.correct_exp_kernel):
            kernel[(2,)](x, torch.empty_like(x), 100, BLOCK=64)
    reports = cr.compile_reports(launches.distinct(), targets=FAST)
    return {r.kernel: r for r in reports}


@needs_backend
@pytest.mark.parametrize("kernel, line, function, referenced", [
    ("numpy_exp_kernel", "np.exp(x)", "numpy_exp_kernel", "<ufunc 'exp'>"),
    ("plain_helper_kernel", "plain_exp(x)", "plain_helper_kernel", "plain_exp"),
    ("nested_numpy_kernel", "return np.exp(x)", "_jitted_exp", "<ufunc 'exp'>")])
def test_a_kernel_only_the_interpreter_accepts_is_reported_with_its_line(planted_reports, kernel, line, function,
                                                                          referenced):
    from tests import planted_kernels

    source = open(planted_kernels.__file__).read().splitlines()
    for target in FAST:
        t = planted_reports[kernel][target]
        assert t.compiles is False
        assert t.where["file"] == planted_kernels.__file__ and t.where["function"] == function
        assert line in source[t.where["line"] - 1] and line in t.where["text"]
        assert "Unsupported function referenced" in t.where["message"] and referenced in t.where["message"]
        assert f"planted_kernels.py:{t.where['line']}" in t.problem()


@needs_backend
def test_the_planted_kernels_run_in_the_interpreter_and_the_correct_one_compiles(planted_reports):
    from coursekit.triton_trace import interpreting
    from tests import planted_kernels as pk

    if not interpreting():
        pytest.skip("the interpreter's leniency is shown without a GPU")
    x = torch.randn(100)
    out = torch.empty(100)
    pk.numpy_exp_kernel[(2,)](x, out, 100, BLOCK=64)
    torch.testing.assert_close(out, torch.exp(x))
    assert planted_reports["correct_exp_kernel"].compiles


@needs_backend
def test_a_compiler_error_points_at_the_kernels_line():
    from tests import planted_kernels as pk

    out = torch.empty(10, dtype=torch.int32)
    report = cr.compile_report(pk.ragged_arange_kernel, cr.specialise(pk.ragged_arange_kernel, out, BLOCK=10),
                               targets=("A100",))
    t = report["A100"]
    assert t.compiles is False and "power of 2" in t.error
    assert t.where["function"] == "ragged_arange_kernel" and "tl.arange(0, BLOCK)" in t.where["text"]


# ---------------------------------------------------------------- the report's parts

def test_specialisation_follows_tritons_rules():
    """Pointers carry their element type and 16-byte alignment, integers their
    divisibility by 16, an integer equal to 1 becomes a constant, and the launch
    options are kept."""
    from bookutils.triton_demo import add_kernel

    x = torch.empty(64, dtype=torch.float16)
    spec = cr.specialise(add_kernel, x, x[1:], x, 1000, BLOCK=64, num_warps=8)
    assert dict(spec.signature) == {"X": "*fp16", "Y": "*fp16", "OUT": "*fp16", "n": "i32", "BLOCK": "constexpr"}
    assert set(spec.divisible_by_16) == {"X", "OUT"}            # x[1:] is 2 bytes off; 1000 % 16 == 8
    assert dict(spec.constexprs) == {"BLOCK": 64} and spec.num_warps == 8 and spec.num_stages == 3
    assert "n" in cr.specialise(add_kernel, x, x, x, 1024, BLOCK=64).divisible_by_16
    assert dict(cr.specialise(add_kernel, x, x, x, 1, BLOCK=64).constexprs) == {"n": 1, "BLOCK": 64}
    with pytest.raises(TypeError, match="no argument"):
        cr.specialise(add_kernel, x, x, x, 10, BLOCK=64, BLOK=3)


def test_record_launches_sees_every_launch_and_can_leave_kernels_unrun():
    from triton.runtime.jit import JITFunction

    from triton.runtime import interpreter

    from bookutils.triton_demo import add_kernel

    originals = JITFunction.run, interpreter.InterpretedFunction.run
    x, out = torch.ones(100, device=DEVICE), torch.zeros(100, device=DEVICE)
    with cr.record_launches(execute=False) as launches:
        add_kernel[(4,)](x, x, out, 100, BLOCK=32)
        add_kernel[(4,)](x, x, out, 100, BLOCK=32)
        add_kernel[(2,)](x, x, out, 100, BLOCK=64)
    assert [launch.spec.kernel for launch in launches] == ["add_kernel"] * 3
    assert [dict(launch.spec.constexprs)["BLOCK"] for launch in launches.distinct()] == [32, 64]
    assert torch.equal(out, torch.zeros_like(out))              # nothing ran
    with cr.record_launches() as launches:
        add_kernel[(4,)](x, x, out, 100, BLOCK=32)
    torch.testing.assert_close(out, 2 * x)
    assert len(launches) == 1
    assert (JITFunction.run, interpreter.InterpretedFunction.run) == originals


def test_record_launches_works_inside_the_kernel_trace():
    """The grader traces hidden tests with trace_kernels; the launches can be recorded at the same time."""
    from bookutils.triton_demo import add_kernel
    from coursekit.triton_trace import interpreting, trace_kernels

    x, out = torch.ones(100, device=DEVICE), torch.zeros(100, device=DEVICE)
    with trace_kernels() as trace, cr.record_launches() as launches:
        add_kernel[(4,)](x, x, out, 100, BLOCK=32)
    assert trace.launches["add_kernel"] == 1 and len(launches) == 1
    if interpreting():
        assert trace.bytes_loaded == 2 * 100 * 4
    torch.testing.assert_close(out, 2 * x)


@pytest.mark.parametrize("target, registers, shared, warps, expected_warps, limit", [
    ("A100", 32, 0, 4, 64, "warps and registers"),  # 16 programs of 4 warps fill the 64 warp slots; 1024 a warp: 64 too
    ("H100", 255, 0, 4, 8, "registers"),           # 255 * 32 -> 8192 registers a warp: 8 warps of 65536
    ("H100", 128, 0, 4, 16, "registers"),          # 4096 a warp: 16 warps
    ("A100", 64, 48 * 1024, 4, 12, "shared memory"),   # (48 + 1) KiB a program: 3 fit in 164 KiB
    ("T4", 32, 48 * 1024, 4, 4, "shared memory"),  # no reserved KiB on a T4: 1 fits in 64 KiB
    ("L4", 40, 0, 8, 48, "warps and registers"),   # an L4 holds 48 warps, not 64; 1280 a warp: 51, so 48
    ("L4", 32, 0, 8, 48, "warps"),                 # 1024 a warp: 64 would fit
    ("T4", 32, 0, 1, 16, "blocks"),                # one-warp programs: the 16-block limit binds
    ("A100", 32, 164 * 1024, 4, 0, "shared memory"),   # over the 163 KiB a program may have
    # ties name every limit: 168 registers -> 5376 a warp, 12 warps = 3 programs of 4;
    # (53 + 1) KiB a program -> 3 in 164 KiB
    ("A100", 168, 53 * 1024, 4, 12, "registers and shared memory"),
])
def test_occupancy_matches_nvidias_calculator(target, registers, shared, warps, expected_warps, limit):
    occ = occupancy(target, registers, shared, warps)
    assert (occ.warps_per_sm, occ.limited_by) == (expected_warps, limit)
    assert occ.fraction == expected_warps / TARGETS[target].max_warps_per_sm


def test_sass_instructions_are_counted_by_opcode():
    listing = """
        /*0a10*/                   HMMA.16816.F32 R4, R8, R12, R4 ;              /* 0x0000000c0804723c */
        /*0a20*/              @!P0 HGMMA.64x64x16.F32 R24, gdesc[UR4], R24 ;     /* 0x00e0000004187df0 */
        /*0a30*/                   STL.64 [R1+0x8], R2 ;                          /* 0x0000080201007387 */
        /*0a40*/                   HMMA.16816.F32 R16, R8, R14, R16 ;            /* 0x0000000e0810723c */
    """
    opcodes = sass_opcodes(listing)
    assert opcodes == {"HMMA": 2, "HGMMA": 1, "STL": 1}
    assert tensor_core_instructions(opcodes) == {"HGMMA": 1, "HMMA": 2}


def test_render_states_every_target_and_explains_failures():
    spec = cr.Specialisation("k", (("X", "*fp16"), ("B", "constexpr")), (("B", 64),), ("X",), ())
    ok = cr.TargetReport("H100", "sm_90a", True, registers=90, spill_stores=0, spill_loads=0, shared=10240,
                         mma={"HGMMA": 8})
    bad = cr.TargetReport("A100", "sm_80", False, error="RuntimeError: boom",
                          where={"file": "f.py", "line": 7, "function": "k", "text": "x", "message": "boom"})
    missing = cr.TargetReport("T4", "sm_75", None, error="this Triton installation has no NVIDIA back end")
    text = cr.render([cr.KernelReport("k", spec, (ok, bad, missing))])
    assert "k [fp16, B=64, 4 warps, 3 stages]" in text and "HGMMA 8" in text and "20/64 warps (registers)" in text   # 90 * 32 -> 3072 a warp: 21, so 20 warps
    assert "k on A100: does not compile: f.py:7 (k): boom" in text
    assert "not tried" in text and "k on T4: not compiled here: this Triton installation has no NVIDIA" in text
    lines = cr.KernelReport("k", spec, (ok, bad, missing)).feedback().splitlines()
    assert lines[0] == "k [fp16, B=64, 4 warps, 3 stages]"
    assert lines[1] == ("  H100 (sm_90a): 90 registers per thread, no spills, 10.0 of 227.0 KiB shared memory, "
                        "HGMMA x8, 20 of 64 warps resident per multiprocessor (limited by registers)")
    assert lines[2] == "  A100 (sm_80): does not compile: f.py:7 (k): boom"
    assert lines[3].startswith("  T4 (sm_75): not compiled here: this Triton installation has no NVIDIA")


def test_without_an_nvidia_back_end_the_report_says_so(monkeypatch):
    from triton import backends

    from bookutils.triton_demo import add_kernel

    monkeypatch.delitem(backends.backends, "nvidia")
    problem = backend_problem()
    assert "no NVIDIA back end" in problem

    def no_compiling(*args, **kwargs):
        raise AssertionError("a compiling process was started")

    monkeypatch.setattr(cr._Worker, "run", no_compiling)
    monkeypatch.setattr(cr, "_MEMORY", {})
    x = torch.empty(16)
    report = cr.compile_report(add_kernel, cr.specialise(add_kernel, x, x, x, 16, BLOCK=16))
    assert [t.compiles for t in report.targets] == [None] * 4
    assert all(t.problem() == "not compiled here: " + problem for t in report.targets)


@needs_backend
def test_results_are_cached_in_memory_and_on_disk(tmp_path, monkeypatch):
    from bookutils.triton_demo import add_kernel

    x = torch.empty(64)
    spec = cr.specialise(add_kernel, x, x, x, 64, BLOCK=32, num_warps=2)
    first = cr.compile_report(add_kernel, spec, targets=("A100",), cache_dir=tmp_path)
    assert first.compiles and len(list(tmp_path.glob("*.json"))) == 1

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(cr._Worker, "run", no_compiling)
    assert cr.compile_report(add_kernel, spec, targets=("A100",)) == first          # this process
    monkeypatch.setattr(cr, "_MEMORY", {})
    assert cr.compile_report(add_kernel, spec, targets=("A100",), cache_dir=tmp_path) == first   # disk


def test_the_disk_cache_ignores_where_a_kernel_is_but_not_what_it_says():
    import copy

    from bookutils.triton_kernels import _flash_forward_kernel
    from coursekit.kernel_source import describe

    description = describe(_flash_forward_kernel)
    moved = copy.deepcopy(description)
    for entry in moved["functions"].values():
        entry["filename"], entry["firstlineno"] = "<cell 3>", entry["firstlineno"] + 40
    edited = copy.deepcopy(description)
    edited["functions"][edited["root"]]["source"] = edited["functions"][edited["root"]]["source"].replace(
        "tl.exp(m - m_new)", "tl.exp2(m - m_new)")

    def key(d, located):
        return cr._cache_key(d, {"spec": 1}, "H100", (), located=located)

    assert key(moved, False) == key(description, False) and key(moved, True) != key(description, True)
    assert key(edited, False) != key(description, False)


@needs_backend
def test_a_compile_that_takes_too_long_is_stopped_and_said_so():
    from bookutils.triton_demo import add_kernel

    x = torch.empty(64)
    spec = cr.specialise(add_kernel, x, x, x, 64, BLOCK=128, num_warps=1)
    report = cr.compile_report(add_kernel, spec, targets=("A100",), timeout=0.01)
    assert report["A100"].compiles is False and "took longer than 0 s" in report["A100"].error


def test_a_stopped_compiling_process_takes_its_children_with_it(tmp_path):
    """ptxas, started by a process that is stopped for taking too long, is stopped too."""
    import pathlib
    import sys
    import time

    hang = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '300']); "
            "open('child.pid', 'w').write(str(p.pid)); sys.stdin.readline(); time.sleep(300)")
    worker = cr._Worker(str(tmp_path), command=lambda workdir: [sys.executable, "-c", hang])
    record = worker.run({"id": 1, "target": "A100"}, timeout=3)
    assert record["compiles"] is False and "took longer than 3 s" in record["error"]
    child = pathlib.Path(f"/proc/{(tmp_path / 'child.pid').read_text()}/stat")
    for _ in range(50):             # gone, or a zombie waiting for its new parent to reap it
        if not child.exists() or child.read_text().split(") ")[1].startswith("Z"):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the compiling process's child outlived it")
