"""Other machines, imitated on this one: the settings that make PyTorch, MKL,
oneDNN and OpenBLAS pick the SIMD kernels another x86-64 processor would get.
Each changes the rounding of sums (another vector width, another order of
additions), so a page or a grade that depends on the order of two numbers that
noise can swap shows it under one of them. The suite runs the pages that train
or time something, and grades the instructor's solutions, under each
(tests/test_machine_variation.py); the release's book build runs under one
of them too."""

# name -> environment variables; "native" is the machine's own choice.
SETTINGS = {
    "native": {},
    # A processor with AVX2 and no AVX-512 (many AMD EPYC and older Intel servers,
    # most laptops): the kernels such a machine gets.
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "OPENBLAS_CORETYPE": "Haswell"},
    # The portable kernels every x86-64 machine can run: what PyTorch calls
    # "default" and OpenBLAS its oldest 64-bit core.
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                 "ONEDNN_MAX_CPU_ISA": "SSE41", "OPENBLAS_CORETYPE": "Prescott"},
}

# The setting the student release's book build runs under in the suite, so that
# the whole book is executed once under another machine's kernels.
RELEASE_BUILD = "avx2"
# The setting test_grading.py grades its planted class under (solutions, correct
# styles, mistakes, hostile notebooks); test_machine_variation.py grades the correct
# work under the others.
GRADED_CLASS = "baseline"
