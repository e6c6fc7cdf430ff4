"""coursekit.fast_interpreter: kernels give the same results and raise the same
errors as under Triton's interpreter as shipped (run in a process of its own,
where nothing installs it), while the wasted work is gone; the replay of
kernels accepts the interpreter it installs; and under a Triton it was not
written for (another version, or a private name missing) it leaves the
interpreter as shipped and says so once."""
import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

KERNELS = textwrap.dedent('''
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    @triton.jit
    def scaled(x, s):                                   # a helper of the kernel's own
        return x * s

    @triton.jit
    def rows_kernel(x_ptr, out_ptr, n, stride, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)       # a call into triton.language's own jit code
        for start in range(0, tl.cdiv(n, BLOCK) * BLOCK, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0)
            acc += scaled(tl.exp(x - tl.max(x, axis=0)), scale)
        idx = (row * 1103515245 + 12345) % 1000         # 32-bit integer arithmetic that wraps
        tl.store(out_ptr + row * BLOCK + tl.arange(0, BLOCK), acc + idx.to(tl.float32))

    @triton.jit
    def bad_kernel(x_ptr, BLOCK: tl.constexpr):
        x = tl.load(x_ptr + tl.arange(0, BLOCK))
        tl.store(x_ptr + tl.arange(0, BLOCK), scaled(x, tl.zeros([2 * BLOCK], dtype=tl.float32)))

    calls = {"patch_lang": 0, "sanitize": 0}
    patch_lang = interpreter._patch_lang
    def counted_patch(fn):
        calls["patch_lang"] += 1
        return patch_lang(fn)
    interpreter._patch_lang = counted_patch
    from triton.language import semantic
    assertion = semantic.TritonSemantic.device_assert    # the overflow check's last step
    def counted_assert(self, *args):
        calls["sanitize"] += 1
        return assertion(self, *args)
    semantic.TritonSemantic.device_assert = counted_assert

    if sys.argv[1] == "fast":           # after the counters: it calls the counted _patch_lang
        from coursekit.fast_interpreter import install
        install()
    elif sys.argv[1] == "other_version":  # a Triton the patches were not written for
        triton.__version__ = "3.8.0"
        from coursekit.fast_interpreter import install
        install()
        from coursekit.triton_env import triton_device
        triton_device(quiet=True)       # installs again: still said once

    x = torch.from_numpy(np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32))
    out = torch.empty(5, 16)
    rows_kernel[(5,)](x, out, 37, 37, 0.5, BLOCK=16)
    try:
        bad_kernel[(1,)](torch.zeros(4), BLOCK=4)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"out": out.numpy().tolist(), "error": error, **calls}))
''')


def _run(mode, tmp_path):
    script = tmp_path / "kernels.py"
    script.write_text(KERNELS)
    proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


def test_results_and_errors_are_those_of_the_interpreter_as_shipped(tmp_path):
    shipped, fast = _run("shipped", tmp_path), _run("fast", tmp_path)
    assert fast["out"] == shipped["out"]                 # bit for bit
    assert shipped["error"] and fast["error"] == shipped["error"]
    # The interpreter as shipped patches triton.language again at every helper call
    # and builds an overflow check for every 32-bit integer operation.
    assert shipped["patch_lang"] > 20 and shipped["sanitize"] > 20
    # Installed: once per launch and once for the module the helpers see (tl.core), no check.
    assert fast["patch_lang"] <= 4 and fast["sanitize"] == 0


def test_another_triton_keeps_the_interpreter_as_shipped_and_says_so_once(tmp_path):
    shipped, other = _run("shipped", tmp_path), _run("other_version", tmp_path)
    assert other["out"] == shipped["out"] and other["error"] == shipped["error"]
    # Nothing replaced: the interpreter does all its work, as shipped.
    assert (other["patch_lang"], other["sanitize"]) == (shipped["patch_lang"], shipped["sanitize"])
    assert other["stderr"].count("coursekit.fast_interpreter:") == 1, other["stderr"]
    assert "found Triton 3.8.0" in other["stderr"] and "as shipped" in other["stderr"]


def test_an_interpreter_without_a_patched_name_is_left_as_shipped():
    code = ("from triton.runtime import interpreter\n"
            "launch, patch_lang = interpreter.GridExecutor.__call__, interpreter._patch_lang\n"
            "del interpreter._LangPatchScope\n"
            "from coursekit.fast_interpreter import install\n"
            "install(); install()\n"
            "print(interpreter.GridExecutor.__call__ is launch, interpreter._patch_lang is patch_lang)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "True"]
    assert proc.stderr.count("coursekit.fast_interpreter:") == 1, proc.stderr
    assert "has no _LangPatchScope" in proc.stderr


@pytest.mark.parametrize("first", ["triton_env", "kernel_replay"])
def test_the_replay_accepts_the_installed_interpreter(first):
    steps = {"triton_env": "from coursekit.triton_env import triton_device; triton_device(quiet=True)\n",
             "kernel_replay": "import coursekit.kernel_replay\n"}
    code = (steps[first] + "".join(step for name, step in steps.items() if name != first)
            + "from coursekit.fast_interpreter import install; install()\n"
            "from coursekit.kernel_replay import changed_names\n"
            "from triton.runtime import interpreter\n"
            "print(changed_names(), interpreter.GridExecutor.__call__.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[]", "fast_launch"]
