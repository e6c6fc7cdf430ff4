"""Measurements taken in the student's process, where the student's code runs
(the grader asks for them with autograde.sandbox.in_student_process): peak
memory as the process sees it, Triton kernel launches and bytes, the PyTorch
operators a launcher used, a launcher's call replayed on changed inputs. They
return what they saw; the grader decides what it means, and checks what it can
from outside (autograde.memory, autograde.recorded_calls, the process without
PyTorch). Nothing here knows an expected answer."""
import contextlib

import numpy as np

from coursekit.memory import numpy_bytes_peak, traced_peak
from student_runtime.calls import GradingFailure, call
from student_runtime.wire import real_torch


def inside_numpy_peak(fn, *args, **kwargs):
    """(result, peak bytes NumPy allocates during fn(*args, **kwargs)): what
    the notebooks' setup helper `peak_bytes` measures."""
    with numpy_bytes_peak() as numpy_bytes:
        result = fn(*args, **kwargs)
    return result, numpy_bytes[0]


def inside_peak(fn, *args, **kwargs):
    """(result, peak bytes that NumPy, and PyTorch where it exists, allocate
    during fn(*args, **kwargs)), as seen from inside this process: the
    grader's measurement from outside (autograde.memory) is the one it trusts;
    this one explains a small peak to the byte."""
    if real_torch() is None:  # the process without PyTorch
        return inside_numpy_peak(fn, *args, **kwargs)
    return traced_peak(fn, *args, **kwargs)


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

def new_tensors_during(fn, args, kwargs):
    """(fn(*args, **kwargs), [(shape, bytes)] of each tensor that a PyTorch operator made during
    the call, views of the operator's tensor arguments left out): what Chapter 4's setup helper
    `new_tensors` reports, taken where the student's code runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    made = []

    def storage(t):
        return t.untyped_storage().data_ptr()

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            known = {storage(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            made.extend((tuple(t.shape), t.numel() * t.element_size()) for t in tree_leaves(result)
                        if isinstance(t, torch.Tensor) and storage(t) not in known)
            return result

    with Watch():
        result = fn(*args, **kwargs)
    return result, made


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
