"""Measurements for Chapter 4's capstone, taken in the student's process: the
notebook's small decoder (its given cell's source, sent by the grader) trained
with the student's attention, and generation with the student's `generate`.
They return what they saw (losses, tokens, which kernels ran, which PyTorch
operators the host used, the caches handed to decode_attention); the grader
decides what it means. Nothing here knows an expected answer."""
import math

from student_runtime.calls import GradingFailure, call

# PyTorch operators that compute attention itself; what the attention calls must leave to the kernels.
ATTENTION_OPS = ("softmax", "_softmax", "log_softmax", "_log_softmax", "mm", "bmm", "addmm", "baddbmm", "matmul",
                 "dot", "einsum", "scaled_dot_product", "flash_attention", "efficient_attention")


def _model(source, vocab, weights=None):
    """The decoder of the notebook's given cell, built here from its source, on the device Triton runs on."""
    import torch

    from coursekit.triton_env import triton_device

    namespace = {"torch": torch, "math": math, "__name__": "capstone_model"}
    exec(compile(source, "<the notebook's model cell>", "exec"), namespace)
    model = namespace["TinyDecoder"](vocab)
    if weights is not None:
        model.load_state_dict({name: torch.as_tensor(value) for name, value in weights.items()})
    return namespace, model.to(triton_device(quiet=True))


def _recorder():
    """A dispatch mode that, while `active`, keeps the operators' names and the bytes of the
    largest tensor an operator made in new memory (views and in-place results are not new)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.active, self.names, self.largest, self.largest_op = True, set(), 0, None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if not self.active:
                return result
            self.names.add(func.overloadpacket.__name__)
            inputs = {a.untyped_storage().data_ptr() for a in list(args) + list((kwargs or {}).values())
                      if isinstance(a, torch.Tensor)}
            for out in result if isinstance(result, (tuple, list)) else (result,):
                if isinstance(out, torch.Tensor) and not out._is_view() \
                        and out.untyped_storage().data_ptr() not in inputs:
                    size = out.numel() * out.element_size()
                    if size > self.largest:
                        self.largest, self.largest_op = size, func.overloadpacket.__name__
            return result

    return Recorder()


def training_run(attention, source, vocab):
    """The notebook's `train` of its `TinyDecoder` with `attention`: the losses, and for each
    attention call the PyTorch operators it used and the kernels it launched; the launches of
    the whole run (the backward's included) by kernel name, and the kernels' modules."""
    import torch

    from coursekit.triton_trace import trace_kernels

    namespace, model = _model(source, vocab)
    calls = []

    def watched(q, k, v):
        before = trace.total_launches
        with _recorder() as ops:
            out = call(attention, q, k, v, what="kernel_attention(q, k, v)")
        calls.append({"ops": sorted(ops.names), "launches": trace.total_launches - before,
                      "shape": list(out.shape) if isinstance(out, torch.Tensor) else None})
        if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype:
            got = f"{out.dtype} of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise GradingFailure(f"kernel_attention(q, k, v) with q of shape {tuple(q.shape)} should return a "
                                 f"{q.dtype} tensor of q's shape, but returned {got}.")
        return out

    with trace_kernels() as trace:
        try:
            losses = namespace["train"](model, watched)
        except GradingFailure:
            raise
        except NotImplementedError:
            raise GradingFailure("kernel_attention raised NotImplementedError: the function is not written yet.") \
                from None
        except Exception as exc:  # the backward pass runs the student's kernels through autograd
            raise GradingFailure(f"kernel_attention: training the model with it raised {type(exc).__name__}: {exc}") \
                from None
    names = {}
    for name, *_ in trace.log:
        names[name] = names.get(name, 0) + 1
    return {"losses": [float(x) for x in losses], "calls": calls, "launches": trace.total_launches,
            "by_kernel": names, "modules": sorted(m for m in trace.modules if m)}


class _DecodeWatch:
    """Stands in for the notebook's decode_attention while `generate` runs: records each call
    (q's shape, the caches' storages, shapes and strides, the lengths), pauses the operator
    recorder during the call (decode_attention is graded on its own) and keeps the caches
    alive so that no storage address is reused within the run."""

    def __init__(self, decode_attention, recorder, layers):
        self.decode_attention, self.recorder, self.calls, self.kept = decode_attention, recorder, [], []
        self.layers = layers

    def __call__(self, q, k_cache, v_cache, cache_lens, *args, **kwargs):
        import torch

        entry = {"q": list(q.shape) if isinstance(q, torch.Tensor) else None}
        for name, cache in (("k", k_cache), ("v", v_cache)):
            if isinstance(cache, torch.Tensor):
                self.kept.append(cache)
                entry[name] = {"storage": cache.untyped_storage().data_ptr(),
                               "storage_bytes": cache.untyped_storage().nbytes(), "shape": list(cache.shape),
                               "element": cache.element_size()}
        entry["lens"] = [int(x) for x in cache_lens.tolist()] if isinstance(cache_lens, torch.Tensor) else None
        self.calls.append(entry)
        self.recorder.active = False
        try:
            return self.decode_attention(q, k_cache, v_cache, cache_lens, *args, **kwargs)
        finally:
            self.recorder.active = True
            if len(self.calls) <= self.layers:   # what the prefill and the first step made (caches allocated
                self.recorder.largest, self.recorder.largest_op = 0, None   # layer by layer) is not counted


def generation_run(generate, source, vocab, weights, prompts, n_new):
    """generate(model, prompts, n_new) with the notebook's `TinyDecoder` holding `weights`, the
    prompts as 1-D token tensors, under watch: the tokens it returned (None if not a tensor
    of integers), every decode_attention call, the PyTorch operators the host used outside
    decode_attention and the largest tensor it made in new memory after the first decoding step
    (one call per layer: the prefill's and the caches' allocations are before)."""
    import torch

    _, model = _model(source, vocab, weights)
    device = model.out.weight.device
    prompts = [torch.tensor(p, dtype=torch.long, device=device) for p in prompts]
    scope = getattr(generate, "__globals__", {})
    original = scope.get("decode_attention")
    if original is None:
        raise GradingFailure("generate: the notebook has no decode_attention (Exercise 5) for it to call.")
    recorder = _recorder()
    watch = _DecodeWatch(original, recorder, len(model.blocks))
    scope["decode_attention"] = watch
    try:
        with torch.no_grad(), recorder:
            recorder.active = True
            found = call(generate, model, prompts, n_new, what=f"generate(model, prompts of lengths "
                                                                f"{[len(p) for p in prompts]}, n_new={n_new})")
    finally:
        scope["decode_attention"] = original
    tokens = found.detach().cpu().numpy() if isinstance(found, torch.Tensor) and not found.is_floating_point() \
        else None
    return {"tokens": tokens, "returned": f"{type(found).__name__}" + (
                f" of dtype {found.dtype} and shape {tuple(found.shape)}" if isinstance(found, torch.Tensor) else ""),
            "calls": watch.calls, "ops": sorted(recorder.names), "largest": recorder.largest,
            "largest_op": recorder.largest_op}
