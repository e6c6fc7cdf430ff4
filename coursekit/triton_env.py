"""Where Triton kernels run: natively on a CUDA GPU when PyTorch sees one,
otherwise in Triton's interpreter on the CPU. Triton decides at the moment a
kernel is defined (@triton.jit), its own library's functions (tl.max, tl.sum,
tl.cdiv...) included, which it defines when it is first imported: so every
module of the course that imports Triton calls triton_device() first."""
import os
import sys

_MESSAGE = ("No GPU found: Triton kernels run in Triton's interpreter on the CPU "
            "(TRITON_INTERPRET=1): float32 and float16 (no bfloat16 arithmetic), slow, so keep sizes small.")


class TritonModeError(RuntimeError):
    """Triton was imported in one mode and kernels are about to be defined in the other."""


def interpreting():
    """Whether kernels defined from now on run in Triton's interpreter (coursekit.triton_trace re-exports it)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreter_problem():
    """Why Triton's interpreter cannot run the course's kernels with the installed Triton and
    NumPy, in words, or None. Triton's interpreter before 3.7 reads a tensor loop bound with
    int() on a one-element array, which NumPy 2.4 refuses: every `for start in range(lo, hi, B)`
    over bounds computed in the kernel then fails with "only 0-dimensional arrays can be converted
    to Python scalars"."""
    from importlib.metadata import PackageNotFoundError, version

    import numpy as np

    try:
        triton_version = version("triton")
    except PackageNotFoundError:
        return None
    if _major_minor(triton_version) < (3, 7) and _major_minor(np.__version__) >= (2, 4):
        return (f"Triton {triton_version}'s interpreter cannot run a loop whose bounds are tensors (such as "
                f"range(lo, hi, BLOCK_N)) with NumPy {np.__version__}: before Triton 3.7 it needs NumPy older than "
                "2.4. Install triton>=3.7, or numpy<2.4, and restart Python.")
    return None


def _major_minor(text):
    parts = (text.split("+")[0].split(".") + ["0"])[:2]
    return tuple(int("".join(ch for ch in part if ch.isdigit()) or 0) for part in parts)


def triton_device(quiet=False):
    """'cuda' or 'cpu': the device to put kernel inputs on. Sets TRITON_INTERPRET=1
    when there is no GPU, and says so once unless quiet."""
    import torch

    from coursekit.fast_interpreter import install

    # Unless TRITON_INTERPRET asks for the interpreter (e.g. to debug on a GPU machine):
    # the GPU if there is one, else the interpreter.
    if not interpreting():
        if torch.cuda.is_available():
            return "cuda"
        _refuse_mixed_modes()
        os.environ["TRITON_INTERPRET"] = "1"
        if not quiet:
            print(_MESSAGE)
    _say_problem_once()
    install()
    return "cpu"


_problem_checked = False


def _say_problem_once():
    """interpreter_problem(), looked for once per process and said on stderr even when quiet:
    with it, every kernel that loops would fail with a message that does not say why."""
    global _problem_checked
    if not _problem_checked:
        _problem_checked = True
        problem = interpreter_problem()
        if problem:
            print(problem, file=sys.stderr)


def where_kernels_run():
    """Where Triton kernels run in this process, in words (what a grading report says)."""
    import torch

    device = triton_device(quiet=True)
    if device == "cuda":
        return f"natively on the GPU ({torch.cuda.get_device_name()})"
    why = "TRITON_INTERPRET is set" if torch.cuda.is_available() else "no CUDA GPU on this machine"
    return f"in Triton's interpreter on the CPU ({why})"


def _refuse_mixed_modes():
    """Switching to the interpreter after Triton was imported for compiling leaves
    Triton's own library compiled: an interpreted kernel that calls tl.max then
    fails with "Cannot call @triton.jit'd outside of the scope of a kernel". Say
    what happened, where it can be fixed, instead."""
    language = sys.modules.get("triton.language")
    if language is None:
        return
    from triton.runtime.jit import JITFunction

    if isinstance(getattr(language, "max", None), JITFunction):
        raise TritonModeError(
            "Triton was imported before coursekit.triton_env.triton_device() chose where its kernels run, so its "
            "library was made for compiling on a GPU while this machine has none. Call triton_device() (or set "
            "TRITON_INTERPRET=1) before the first `import triton`.")
