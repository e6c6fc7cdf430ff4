"""Measurements taken in the student's process, where the student's code runs
(the grader asks for them with autograde.sandbox.in_student_process): peak
memory, Triton kernel launches and bytes, the PyTorch operators a launcher
used, the calls a function makes to a helper, a launcher's call replayed on
changed inputs. They return what they saw; the grader decides what it means.
Nothing here knows an expected answer."""
import numpy as np

from coursekit.memory import numpy_bytes_peak, traced_peak  # noqa: F401  (traced_peak is asked for by name)
from student_runtime.calls import GradingFailure, call


def numpy_peak(fn, *args):
    """Peak bytes NumPy allocates while fn(*args) runs: what the notebooks'
    setup helper `peak_bytes` measures."""
    with numpy_bytes_peak() as numpy_bytes:
        fn(*args)
    return numpy_bytes[0]


def counting_decode_steps(decode_with_kv_cache, x, *weights, what):
    """(output, calls): decode_step is looked up in the function's own module
    and wrapped for the duration of the call; each call is recorded as
    (x_t, cache_k, cache_v, output_t, threaded): copies of what it was given and
    of the output it returned, and whether the caches it was given are the very
    arrays the previous call returned."""
    namespace = getattr(decode_with_kv_cache, "__globals__", {})
    step = namespace.get("decode_step")
    calls = []
    returned = []  # the caches the latest call returned
    if callable(step):
        def counting_step(x_t, cache_k, cache_v, *args, **kwargs):
            given = [np.array(a, dtype=np.float64, copy=True) for a in (x_t, cache_k, cache_v)]
            threaded = len(returned) == 2 and cache_k is returned[0] and cache_v is returned[1]
            result = step(x_t, cache_k, cache_v, *args, **kwargs)
            try:
                output_t = np.array(result[0], dtype=np.float64, copy=True)
                returned[:] = result[1:3]
            except Exception:  # a malformed result is judged by the caller's checks
                output_t = np.zeros(0)
                returned.clear()
            calls.append((*given, output_t, threaded))
            return result
        namespace["decode_step"] = counting_step
    try:
        found = call(decode_with_kv_cache, x, *weights, what=what)
    finally:
        if callable(step):
            namespace["decode_step"] = step
    return found, calls


def _operator_recorder():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperatorNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()
            self.largest = 0            # bytes of the largest tensor an operator returned
            self.shapes = set()         # the shapes of the tensors operators returned

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            result = func(*args, **(kwargs or {}))
            for out in result if isinstance(result, (tuple, list)) else (result,):
                if isinstance(out, torch.Tensor):
                    self.largest = max(self.largest, out.numel() * out.element_size())
                    self.shapes.add(tuple(out.shape))
            return result

    return OperatorNames()


# ---------------------------------------------------------------- Chapter 4: launchers of Triton kernels

def traced_launcher_call(launcher, args, kwargs, what, record=False, shared_stores=True):
    """launcher(*args, **kwargs) under coursekit.kernel_replay.watch_launcher:
    returns (result, report, recording). The report (plain data) says which
    kernels ran, their grids and (interpreter) bytes, and the PyTorch operators
    of the host; with record=True, under the interpreter, recording is the
    call's record for replayed_launcher_call (None otherwise).
    shared_stores=False leaves out the record of store addresses, for calls
    whose memory is measured."""
    import torch

    from coursekit.kernel_replay import watch_launcher

    with watch_launcher(args, record=record, shared_stores=shared_stores) as watch:
        result = call(launcher, *args, what=what, **kwargs)
        if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            torch.cuda.synchronize()
        watch.finish(result)
    return result, watch.report(), watch.recording


def replayed_launcher_call(recording, seed, positions):
    """The recorded call done again with the inputs at `positions` multiplied by
    signs drawn from `seed` (coursekit.kernel_replay.replay). The grader sends
    the seed only now, after the student's launcher has returned."""
    from coursekit.kernel_replay import replay

    return replay(recording, seed, positions)


def cuda_launcher_peak(launcher, args, kwargs, what):
    """(result, report, peak CUDA bytes beyond what was allocated before the call)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result, report, _ = traced_launcher_call(launcher, args, kwargs, what)
    return result, report, torch.cuda.max_memory_allocated() - base


def launched_kernels(launcher, calls, what):
    """The kernels launcher(*args, **kwargs) launches for each (args, kwargs) of
    `calls`, recorded without running them (or, if the launcher fails on outputs
    never computed, running them): the last launch of each kernel, as plain data
    for compiling in another process (coursekit.compile_report.described)."""
    from coursekit.compile_report import described, record_launches
    from coursekit.kernel_source import raw_function

    last = {}
    for args, kwargs in calls:
        for execute in (False, True):
            try:
                with record_launches(execute=execute) as log:
                    call(launcher, *args, what=what, **kwargs)
                break
            except GradingFailure:
                if execute:
                    raise
        for launch in log:
            last[raw_function(launch.kernel)] = launch
    return described(list(last.values()))


def torch_operators_used(fn, *args, what):
    """(result, names of the PyTorch operators that ran during fn(*args)): the
    NumPy exercises are graded as NumPy code, and PyTorch's own softmax or
    attention would answer them in one line."""
    with _operator_recorder() as ops:
        result = call(fn, *args, what=what)
    return result, sorted(ops.names)


# ---------------------------------------------------------------- Chapter 2: the decoder layer

# PyTorch's own attention layers: a DecoderLayer that hands its work to one of
# them copies the answer instead of writing it.
TORCH_LAYER_FUNCTIONS = ("torch.nn.functional:multi_head_attention_forward",
                         "torch.nn.modules.activation:MultiheadAttention.forward",
                         "torch.nn.modules.transformer:TransformerDecoderLayer.forward",
                         "torch.nn.modules.transformer:TransformerEncoderLayer.forward",
                         "torch.nn.modules.transformer:TransformerDecoder.forward",
                         "torch.nn.modules.transformer:TransformerEncoder.forward",
                         "torch.nn.modules.transformer:Transformer.forward")
TORCH_LAYER_OPS = ("_native_multi_head_attention", "_transformer_encoder_layer_fwd", "_transformer_decoder_only_layer_fwd")


def _torch_layer_codes():
    import importlib

    codes = {}
    for spec in TORCH_LAYER_FUNCTIONS:
        module, _, qualname = spec.partition(":")
        target = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part, None)
        code = getattr(target, "__code__", None)
        if code is not None:
            codes[code] = qualname
    return codes


def torch_layers_used(fn, *args, what):
    """(result, names of PyTorch's attention layers that ran during fn(*args)).
    The functions are recognised by their code objects, however they were
    reached (an attribute, an alias kept from before, a subclass), and the
    fused operators they may dispatch to by name."""
    import sys

    codes = _torch_layer_codes()
    seen = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            seen.add(codes[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        with _operator_recorder() as ops:
            result = call(fn, *args, what=what)
    finally:
        sys.setprofile(previous)
    seen.update(name for name in ops.names if name in TORCH_LAYER_OPS)
    return result, sorted(seen)
