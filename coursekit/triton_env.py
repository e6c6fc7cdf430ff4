"""Where Triton kernels run: natively on a CUDA GPU when PyTorch sees one,
otherwise in Triton's interpreter on the CPU. Triton decides at the moment a
kernel is defined (@triton.jit), so call this before defining or importing any."""
import os

_MESSAGE = ("No GPU found: Triton kernels run in Triton's interpreter on the CPU "
            "(TRITON_INTERPRET=1): float32 and float16 (no bfloat16 arithmetic), slow, so keep sizes small.")


def triton_device(quiet=False):
    """'cuda' or 'cpu': the device to put kernel inputs on. Sets TRITON_INTERPRET=1
    when there is no GPU, and says so once unless quiet."""
    import torch

    from coursekit.fast_interpreter import install

    # Unless TRITON_INTERPRET asks for the interpreter (e.g. to debug on a GPU machine):
    # the GPU if there is one, else the interpreter.
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        if torch.cuda.is_available():
            return "cuda"
        os.environ["TRITON_INTERPRET"] = "1"
        if not quiet:
            print(_MESSAGE)
    install()
    return "cpu"
