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
    install()
    return "cpu"


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
