"""Watching Triton kernels run: how many launches, and, under the interpreter
(TRITON_INTERPRET=1), how many bytes each kernel loads from and stores to memory.

The interpreter executes every tl.load / tl.store through one builder object;
wrapping its masked load and store counts exactly the elements a kernel moves
(masked-off lanes move nothing); an atomic read-modify-write (tl.atomic_add)
counts as one load and one store of its lanes. The interpreter runs the programs
of a launch one after another, where a GPU runs them at once: the trace also
counts the addresses that more than one program of a launch wrote with plain
(non-atomic) stores, whose result on a GPU depends on which program wins. On a
GPU only launches (and their grids) are counted.

`around_launch` lets a caller wrap every interpreted launch, e.g. to record it
for a later replay (coursekit.kernel_replay)."""
import collections
import contextlib

import numpy as np

from coursekit.triton_env import interpreting  # noqa: F401  (the grader and the book import it from here)


class KernelTrace:
    """Counts per kernel name: launches, bytes loaded, bytes stored; and the
    modules that define the launched kernels."""

    def __init__(self):
        self.modules = set()
        self.launches = collections.Counter()
        self.shared_stores = collections.Counter()     # addresses written by several programs of a launch
        self._stores = None
        self.loaded = collections.Counter()
        self.stored = collections.Counter()
        self.log = []       # one (kernel name, programs, bytes loaded, bytes stored) per launch, in order
        self._current = None

    @property
    def total_launches(self):
        return sum(self.launches.values())

    @property
    def bytes_loaded(self):
        return sum(self.loaded.values())

    @property
    def bytes_stored(self):
        return sum(self.stored.values())

    @property
    def bytes_moved(self):
        return self.bytes_loaded + self.bytes_stored


def _moved_bytes(mask, data):
    return int(np.count_nonzero(mask)) * np.asarray(data).dtype.itemsize


def _shared_addresses(stores):
    """How many addresses of [(addresses, program), ...] were written by more than one program."""
    if not stores:
        return 0
    addresses = np.concatenate([a for a, _ in stores])
    programs = np.concatenate([np.full(a.size, p, dtype=np.int64) for a, p in stores])
    pairs = np.unique(np.stack([addresses, programs]), axis=1)
    _, counts = np.unique(pairs[0], return_counts=True)
    return int(np.count_nonzero(counts > 1))


def _programs(grid, kwargs):
    """The number of programs of a compiled launch; None when a grid function
    needs arguments it is not given here."""
    try:
        shape = grid(kwargs) if callable(grid) else grid
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        return int(np.prod([int(g) for g in shape]))
    except Exception:  # noqa: BLE001 (the student's grid function; the launch itself will tell)
        return None


@contextlib.contextmanager
def trace_kernels(shared_stores=True, around_launch=None):
    """Context manager yielding a KernelTrace filled in while it is active.
    shared_stores=False skips the record of store addresses (under the
    interpreter it holds every stored address of a launch: leave it off
    while measuring the memory of the traced code). Under the interpreter,
    around_launch(executor, args, kwargs, run) is called for each launch
    instead of run(), which performs (and counts) the launch itself. Bytes are
    None in the log on a GPU."""
    import triton.runtime.jit as jit

    trace = KernelTrace()
    patches = []

    def patch(owner, name, wrapper):
        original = getattr(owner, name)
        setattr(owner, name, wrapper(original))
        patches.append((owner, name, original))

    if interpreting():
        from triton.runtime import interpreter

        def launch(original):
            def counted(self, *args, **kwargs):
                name = self.fn.__name__
                trace.launches[name] += 1
                trace.modules.add(getattr(self.fn, "__module__", None))
                outer, trace._current = trace._current, name
                outer_stores, trace._stores = trace._stores, [] if shared_stores else None
                loaded, stored = trace.bytes_loaded, trace.bytes_stored
                try:
                    result = original(self, *args, **kwargs)
                    if shared_stores:
                        trace.shared_stores[name] += _shared_addresses(trace._stores)
                    programs = int(np.prod(interpreter.interpreter_builder.grid_dim))
                    trace.log.append((name, programs, trace.bytes_loaded - loaded, trace.bytes_stored - stored))
                    return result
                finally:
                    trace._current, trace._stores = outer, outer_stores

            def run(self, *args, **kwargs):
                if around_launch is None:
                    return counted(self, *args, **kwargs)
                return around_launch(self, args, kwargs, lambda: counted(self, *args, **kwargs))
            return run

        def load(original):
            def masked_load(self, ptrs, mask, other, *rest):
                result = original(self, ptrs, mask, other, *rest)
                trace.loaded[trace._current] += _moved_bytes(mask.data, result.data)
                return result
            return masked_load

        def store(original):
            def masked_store(self, ptrs, value, mask, *rest):
                trace.stored[trace._current] += _moved_bytes(mask.data, value.data)
                if trace._stores is not None:
                    x, y, z = self.grid_idx
                    program = (x * self.grid_dim[1] + y) * self.grid_dim[2] + z
                    where = np.asarray(ptrs.data, dtype=np.int64)[np.broadcast_to(np.asarray(mask.data, bool),
                                                                                  np.shape(ptrs.data))]
                    trace._stores.append((where.ravel(), program))
                return original(self, ptrs, value, mask, *rest)
            return masked_store

        def atomic(original):
            def read_modify_write(self, op, ptrs, value, mask, *rest):
                moved = _moved_bytes(mask.data, value.data)
                trace.loaded[trace._current] += moved
                trace.stored[trace._current] += moved
                return original(self, op, ptrs, value, mask, *rest)
            return read_modify_write

        patch(interpreter.GridExecutor, "__call__", launch)
        patch(interpreter.InterpreterBuilder, "create_masked_load", load)
        patch(interpreter.InterpreterBuilder, "create_masked_store", store)
        patch(interpreter.InterpreterBuilder, "create_atomic_rmw", atomic)
    else:
        def compiled_launch(original):
            def run(self, *args, grid, warmup=False, **kwargs):
                if not warmup:
                    trace.launches[self.fn.__name__] += 1
                    trace.modules.add(getattr(self.fn, "__module__", None))
                    trace.log.append((self.fn.__name__, _programs(grid, kwargs), None, None))
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            return run

        patch(jit.JITFunction, "run", compiled_launch)
    try:
        yield trace
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)
