"""Recording what a Triton launcher did, and doing it again on inputs whose
signs were changed: how the grader tells results computed by kernels from
results computed on the host, under Triton's interpreter.

The question is which code computed a launcher's results: its kernels, or its
host code (NumPy, Python, PyTorch) with a kernel that only copies the answer
out. Changing some inputs only where the kernels load them, during the call,
does not settle it: a first kernel can copy an input out, the host computes
from the copy (which carries the change), and a last kernel stores the answer.
Anything that perturbs the call while the student's code runs is also within
that code's reach (a patched function's closure, a frame, an object).

So the call itself is left alone and recorded, and the perturbation happens
afterwards, in a replay that no host code of the student takes part in:

1. While the launcher runs (`watch_launcher`), the record keeps, in order: every
   kernel launch (the kernel and its arguments), every PyTorch operation of the
   host (through a dispatch mode), and every change of memory that neither
   explains (what the host wrote through NumPy, Python or a copy of data it had
   read), as the bytes written.
2. After the launcher has returned, the grader sends a fresh secret seed in a
   second request (`replay`). The replay gives every storage the record touched
   a private copy, multiplies chosen inputs (the keys and values) by random
   signs drawn from the seed, and does the record again on the copies: kernels
   run again on what they load there; PyTorch operations run again on the
   copies; what the host wrote any other way is written again byte for byte.

What kernels compute from the changed inputs follows the signs, through any
chain of kernels and through PyTorch's moves of data (views, copies, casts,
`.contiguous()`, concatenation). What the host computed from anything it read,
a kernel's copy of an input included, is written again as it was and does not
follow: the host only ever saw the real call, and the signs did not exist
while it ran. PyTorch arithmetic of the host is replayed too (a merge of
partial states or a sum over grouped heads is allowed host work), so its
amount is measured: each replayed operation that is not a pure move and reads
data that depends on the changed inputs adds the elements it reads or writes
to `host_work`; the grader bounds it far below what attention's products need.

Limits, said plainly. Kernel code under the interpreter is Python: a kernel
that calls NumPy computes "in the kernel" here (it does not compile for a GPU).
Code the student left behind could act during the replay: the replay refuses
to run when an attribute of Triton's interpreter, NumPy, PyTorch's Tensor,
`inspect` or this module was rebound after they were imported (before any
student code ran); it does not run the student's grid functions again (the
recorded grids are used), and it runs with the garbage collector off, so no
student finalizer runs in it. A thread the student left running is not
excluded. The probe that asks for the replay must itself be the grader's (a
student who rebinds the probes could answer for them): keeping the probes out
of the student's reach is the sandbox's job.

On a GPU nothing is recorded: kernels compile, and only launches are traced."""
import contextlib

import numpy as np
from torch.utils._python_dispatch import TorchDispatchMode

# Operators that only move, select or fill data, and views: replaying them is
# exact, and they compute nothing from the values they move.
MOVES = frozenset("""
    alias as_strided cat chunk clone constant_pad_nd contiguous copy copy_ _copy_from _copy_from_and_resize
    detach diagonal empty_like empty_strided expand expand_as fill fill_ flip full_like gather index
    index_copy index_copy_ index_put index_put_ index_select lift_fresh lift_fresh_copy masked_fill
    masked_fill_ masked_scatter movedim narrow new_empty new_empty_strided new_full new_ones new_zeros
    ones_like pad permute repeat repeat_interleave _reshape_alias _reshape_copy reshape resize_ roll
    scatter scatter_ select set_ slice split split_with_sizes squeeze squeeze_ stack t t_ take to _to_copy
    transpose transpose_ tril triu unbind unfold unsqueeze unsqueeze_ _unsafe_view view view_as where
    zero_ zeros_like""".split())


def flip_signs(seed, shapes):
    """+1 or -1 for every element of each shape, drawn from the seed: the grader
    draws the same signs to compute what the replayed results must be."""
    rng = np.random.default_rng(seed)
    return [rng.choice(np.array([-1.0, 1.0]), size=tuple(shape)) for shape in shapes]


def _namespaces():
    """The namespaces whose functions a replay runs through: Triton's interpreter,
    and the parts of NumPy, PyTorch and the standard library it calls. (Not
    triton.language: the interpreter itself leaves some of its functions rebound
    after a launch. A kernel that relies on a patched triton.language does not
    compile for a GPU.)"""
    import inspect
    import sys

    import torch
    import torch.utils._pytree as pytree
    from triton.runtime import interpreter

    # PyTorch rebinds some of its own functions when a submodule loads (torch._dynamo wraps
    # torch.manual_seed): of its top level, only what the replay calls.
    used = {name: getattr(torch, name) for name in ("empty", "from_numpy", "UntypedStorage", "Tensor")}
    spaces = {"inspect": vars(inspect), "numpy": vars(np), "torch": used, "torch.Tensor": vars(torch.Tensor),
              "torch.utils._pytree": vars(pytree), "interpreter": vars(interpreter),
              "interpreter._interpreter": vars(interpreter._interpreter), "kernel_replay": vars(sys.modules[__name__])}
    for name, value in vars(interpreter).items():
        if isinstance(value, type) and value.__module__ == interpreter.__name__:
            spaces[f"interpreter.{name}"] = vars(value)
    return spaces


def _fingerprint():
    """(namespace, name) -> the object bound there, for every attribute of those
    namespaces, and for the functions set on the interpreter's builder objects."""
    from triton.runtime import interpreter

    bound = {(space, name): value for space, names in _namespaces().items() for name, value in list(names.items())}
    for owner in ("interpreter_builder", "interpreter_semantic"):
        for name, value in list(vars(getattr(interpreter, owner, None) or object()).items()):
            if callable(value):
                bound[(owner, name)] = value
    return bound


def changed_names():
    """The attributes of those namespaces rebound (or deleted, or functions added to
    the builders) since this module was imported, before any student code ran: a
    replay must not run through them."""
    if _ORIGINAL is None:
        return ["Triton's interpreter (not available)"]
    now = _fingerprint()
    missing = object()
    changed = {f"{space}.{name}" for (space, name), value in _ORIGINAL.items()
               if now.get((space, name), missing) is not value}
    changed |= {f"{space}.{name}" for space, name in now if space.startswith("interpreter_")
                and (space, name) not in _ORIGINAL}
    return sorted(changed)


@contextlib.contextmanager
def _quiet():
    """Bookkeeping with PyTorch that no dispatch mode sees."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def _tensor(x):
    import torch

    return isinstance(x, torch.Tensor)


def _flat(tree):
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(tree) if _tensor(x)]


def _key(t):
    storage = t.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else None


def _bytes(storage):
    import torch

    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))


class _Ref:
    """Where a tensor lives: its storage (by address) and its geometry."""

    __slots__ = ("key", "dtype", "offset", "size", "stride")

    def __init__(self, t):
        self.key, self.dtype = _key(t), t.dtype
        self.offset, self.size, self.stride = t.storage_offset(), tuple(t.size()), tuple(t.stride())

    def numel(self):
        return int(np.prod(self.size))


def _refs(tree):
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: _Ref(x) if _tensor(x) else x, tree)


def _written(func, args, kwargs):
    """The arguments an operator writes into (in-place and out= forms)."""
    written = []
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            written.append(args[i] if i < len(args) else kwargs.get(argument.name))
    return written


class Recording:
    """The events of one launcher call, in order (see the module's docstring).
    The storages it saw are kept alive, so that no address is reused during
    the call."""

    def __init__(self, inputs):
        self.events = []
        self._storages = {}     # key -> the real storage
        self._known = {}        # key -> the bytes the record accounts for
        self._paused = 0
        self.inputs = [_Ref(x) if _tensor(x) else None for x in inputs]
        self.result = None
        with _quiet():
            for x in _flat(list(inputs)):
                self._sync(x)
        self.events.append(("start",))

    def _sync(self, t):
        """Record what the host changed in t's storage since the record last
        accounted for it (all of it, the first time)."""
        key = _key(t)
        if key is None:
            return
        now = _bytes(t.untyped_storage())
        known = self._known.get(key)
        if known is None:
            self._storages[key] = t.untyped_storage()
            changed = None
        elif known.shape == now.shape and bool((known == now).all()):
            return
        else:
            changed = (known != now) if known.shape == now.shape else None
        snapshot = now.clone()
        self.events.append(("write", key, changed, snapshot))
        self._known[key] = snapshot

    def _account(self, tensors):
        """The current bytes of these storages are explained by the event just recorded."""
        for t in tensors:
            key = _key(t)
            if key is not None:
                self._storages.setdefault(key, t.untyped_storage())
                self._known[key] = _bytes(t.untyped_storage()).clone()

    def launch(self, executor, args, kwargs, run):
        """A kernel launch (trace_kernels' around_launch). Its grid is kept as
        numbers: a grid function is the student's code, and is not run again."""
        import copy

        from triton.runtime import interpreter

        tensors = _flat([list(args), dict(kwargs)])
        with _quiet():
            for t in tensors:
                self._sync(t)
        self._paused += 1      # the interpreter's own tensor operations are part of the launch
        try:
            result = run()
        finally:
            self._paused -= 1
        with _quiet():
            fixed = copy.copy(executor)
            fixed.grid = tuple(int(g) for g in interpreter.interpreter_builder.grid_dim)
            self.events.append(("launch", fixed, _refs(list(args)), _refs(dict(kwargs))))
            self._account(tensors)
        return result

    def operation(self, func, args, kwargs, run):
        """A PyTorch operation of the host (HostOps)."""
        inputs = _flat([list(args), dict(kwargs)])
        if self._paused or not inputs:
            return run()        # a factory's result is host data, recorded when it is used
        with _quiet():
            for t in inputs:
                self._sync(t)
        result = run()
        outputs = _flat(result)
        if outputs or _written(func, args, kwargs):
            with _quiet():
                self.events.append(("op", func, _refs(list(args)), _refs(dict(kwargs)), _refs(result)))
                self._account(inputs + outputs)
        return result

    def finish(self, result):
        """The launcher returned `result`."""
        with _quiet():
            for t in _flat(result):
                self._sync(t)
            self.result = _refs(result)


class HostOps(TorchDispatchMode):
    """A PyTorch dispatch mode over the launcher's host code: the operators it
    used, the shapes and the largest size of the tensors they returned, and,
    given a Recording, each operation for the replay."""

    def __init__(self, recording=None):
        super().__init__()
        self.recording = recording
        self.names = set()
        self.largest = 0        # bytes of the largest tensor an operator returned
        self.largest_new = 0    # the same, views of the operator's tensor arguments left out (copies, buffers)
        self.shapes = set()     # the shapes of the tensors operators returned

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        recording = self.recording
        if recording is None:
            result = func(*args, **kwargs)
        elif recording._paused:
            return func(*args, **kwargs)
        else:
            result = recording.operation(func, args, kwargs, lambda: func(*args, **kwargs))
        self.names.add(func.overloadpacket.__name__)
        known = {_storage(t) for t in _flat((args, kwargs))}
        for out in _flat(result):
            size = out.numel() * out.element_size()
            self.largest = max(self.largest, size)
            if _storage(out) not in known:
                self.largest_new = max(self.largest_new, size)
            self.shapes.add(tuple(out.shape))
        return result


def _storage(t):
    """Where a tensor's memory starts: a view shares it with its base, a copy does not."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):   # tensors without storage (meta, some subclasses)
        return id(t)


class Watch:
    """What watch_launcher saw: the kernel trace, the host's operators and,
    when asked for, the Recording."""

    def __init__(self, trace, ops, recording):
        self.trace, self.ops, self.recording = trace, ops, recording

    def finish(self, result):
        if self.recording is not None:
            self.recording.finish(result)

    def report(self):
        """Plain data for the grader."""
        from coursekit.triton_trace import interpreting

        trace = self.trace
        return {"interpreting": interpreting(), "launches": trace.total_launches,
                "modules": sorted(m for m in trace.modules if m), "log": [list(entry) for entry in trace.log],
                "bytes_loaded": trace.bytes_loaded, "bytes_stored": trace.bytes_stored,
                "shared_stores": {name: n for name, n in trace.shared_stores.items() if n},
                "ops": sorted(self.ops.names), "largest": self.ops.largest, "largest_new": self.ops.largest_new,
                "shapes": sorted(list(shape) for shape in self.ops.shapes)}


@contextlib.contextmanager
def watch_launcher(inputs, record=False, shared_stores=True):
    """Context manager yielding a Watch over a launcher called with `inputs`
    (its positional arguments): kernels traced, host operators recorded, and
    with record=True (under the interpreter) a Recording for `replay`. Call
    watch.finish(result) with what the launcher returned."""
    from coursekit.triton_trace import interpreting, trace_kernels

    recording = Recording(inputs) if record and interpreting() else None
    around = recording.launch if recording is not None else None
    with trace_kernels(shared_stores, around_launch=around) as trace, HostOps(recording) as ops:
        yield Watch(trace, ops, recording)


def _view(world, ref):
    import torch

    if ref.key is None:
        return torch.empty(ref.size, dtype=ref.dtype)
    return torch.empty(0, dtype=ref.dtype).set_(world[ref.key], ref.offset, ref.size, ref.stride)


def _adopt(world, ref, value):
    """A storage for the replayed result `value` of an operation whose real result was `ref`."""
    import torch

    if ref.key is None or ref.key in world or not _tensor(value):
        return
    same = (value.storage_offset(), tuple(value.size()), tuple(value.stride())) == (ref.offset, ref.size, ref.stride)
    if same and value.dtype == ref.dtype:
        world[ref.key] = value.untyped_storage()
        return
    nbytes = (ref.offset + sum((n - 1) * s for n, s in zip(ref.size, ref.stride)) + 1) * value.element_size()
    world[ref.key] = torch.UntypedStorage(max(nbytes, 1))
    _view(world, ref).copy_(value)


def replay(recording, seed, positions):
    """Do the recorded call again on private copies of memory in which the
    launcher's positional inputs at `positions` are multiplied by signs drawn
    from `seed` (flip_signs). Returns a dict: `outputs`, the replayed results
    (the launcher's return value, tensors cloned); `host_work`, the elements
    read or written by replayed PyTorch arithmetic on data that depends on
    the changed inputs, and `host_ops`, those operators; `changed`, the
    attributes of the libraries the replay runs through that were rebound since
    they were imported (then nothing is replayed)."""
    import gc

    changed = changed_names()
    if changed:
        return {"outputs": None, "host_work": 0, "host_ops": [], "changed": changed}
    gc.collect()            # finalizers of the student's objects run now, not during the replay
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _replay(recording, seed, positions)
    finally:
        if enabled:
            gc.enable()


def _replay(recording, seed, positions):
    import torch
    from torch.utils._pytree import tree_leaves, tree_map
    from triton.runtime import interpreter

    run_launch = interpreter.GridExecutor.__call__
    perturbed = [recording.inputs[p] for p in positions]
    signs = flip_signs(seed, [ref.size for ref in perturbed])
    world, tainted = {}, set()
    work, ops = 0, set()

    def views(tree):
        return tree_map(lambda x: _view(world, x) if isinstance(x, _Ref) else x, tree)

    for event in recording.events:
        kind = event[0]
        if kind == "write":
            _, key, mask, snapshot = event
            if key not in world or mask is None:
                world[key] = snapshot.clone().untyped_storage()
            else:
                target = _bytes(world[key])
                target[mask] = snapshot[mask]
        elif kind == "start":
            for ref, sign in zip(perturbed, signs):
                view = _view(world, ref)
                view.mul_(torch.from_numpy(sign).to(view.dtype))
                tainted.add(ref.key)
        elif kind == "launch":
            _, executor, args, kwargs = event
            run_launch(executor, *views(args), **views(kwargs))
            keys = {ref.key for ref in tree_leaves([args, kwargs]) if isinstance(ref, _Ref)}
            if keys & tainted:
                tainted |= keys
        else:
            _, func, args, kwargs, result = event
            refs_in = [x for x in tree_leaves([args, kwargs]) if isinstance(x, _Ref)]
            value = func(*views(args), **views(kwargs))
            refs_out = [x for x in tree_leaves(result) if isinstance(x, _Ref)]
            for ref, out in zip(tree_leaves(result), tree_leaves(value)):
                if isinstance(ref, _Ref):
                    _adopt(world, ref, out)
            if {ref.key for ref in refs_in} & tainted:
                written = [x for x in tree_leaves(_written(func, args, kwargs)) if isinstance(x, _Ref)]
                tainted |= {ref.key for ref in refs_out + written}
                name = func.overloadpacket.__name__
                if name not in MOVES:
                    work += max(ref.numel() for ref in refs_in + refs_out)
                    ops.add(name)
    outputs = tree_map(lambda x: _view(world, x).clone() if isinstance(x, _Ref) else None, recording.result)
    return {"outputs": outputs, "host_work": int(work), "host_ops": sorted(ops), "changed": []}


try:  # imported before any student code runs (the sandbox preloads this module)
    from coursekit.triton_env import triton_device

    triton_device(quiet=True)     # before Triton is imported; installs the faster interpreter when it is used
    _ORIGINAL = _fingerprint()
except ImportError:  # no Triton: nothing is replayed
    _ORIGINAL = None
