"""Two pieces of work Triton's interpreter (TRITON_INTERPRET=1) does for nothing,
left out; what kernels compute, and every error they raise, stays the same.

- A call of one @triton.jit function from another (tl.zeros, tl.cdiv, a helper of
  the kernel's own) patches triton.language again, walking every member of the
  modules the callee can see, though the launch already patched them: here a
  module is patched once per launch, the first time a function that sees it runs.
- Integer arithmetic on 32 bits is redone on 64 bits to build an overflow
  assertion that tl.device_assert then drops, because the interpreter's options
  have debugging off (as a GPU build does unless TRITON_DEBUG=1): with debugging
  off it is not built.

The course's kernels call helpers in their loops, so both add up (the tests
compare results and errors with the interpreter as shipped:
tests/test_fast_interpreter.py). install() is idempotent;
coursekit.kernel_replay calls it as it is imported, before it notes the
interpreter's functions (a replay refuses to run through functions rebound after
that), and coursekit.triton_env.triton_device calls it when kernels are to be
interpreted.

Both patches replace private functions of the interpreter of Triton 3.9.0, the
version requirements.txt pins. Under any other version, or where a name they
replace is missing, install() leaves the interpreter as shipped (the same
results, more slowly) and says so once per process on stderr."""
import dataclasses
import sys

WRITTEN_FOR = "3.9.0"   # the Triton whose interpreter these patches were written against
_said = False           # whether the fallback has been reported in this process


def install():
    """Make Triton's interpreter skip its wasted work, if this Triton is the one
    the patches were written for; otherwise leave it as shipped and say so once."""
    problem = _unsupported()
    if problem:
        _say_once(problem)
        return
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang, "_course_fast", False):
        return
    import triton.language as tl

    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    launch_state = {"patched": None}   # during a launch: ids of the triton.language modules patched in it

    def modules(fn):
        return {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}

    def fast_patch_lang(fn):           # called by a launch, and again by every call inside it
        patched, seen = launch_state["patched"], modules(fn)
        if patched is not None and seen <= patched:
            return interpreter._LangPatchScope()   # nothing left to patch, nothing to restore
        scope = patch_lang(fn)
        if patched is not None:
            patched |= seen
        return scope

    def fast_launch(self, *args, **kwargs):
        launch_state["patched"] = set()
        try:
            return launch(self, *args, **kwargs)
        finally:                       # the launch has restored what it patched
            launch_state["patched"] = None

    fast_patch_lang._course_fast = True
    interpreter._patch_lang = fast_patch_lang
    interpreter.GridExecutor.__call__ = fast_launch
    options = interpreter.interpreter_builder.options
    if not options.debug:
        interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _unsupported():
    """Why the patches cannot be applied to this Triton, in words, or None."""
    try:
        import triton
        from triton.runtime import interpreter
    except Exception as exc:          # not only ImportError: a broken installation may raise anything
        return f"Triton's interpreter could not be imported ({type(exc).__name__}: {exc})"
    version = getattr(triton, "__version__", "unknown")
    if version != WRITTEN_FOR:        # private functions change between releases, without notice
        return f"written for Triton {WRITTEN_FOR}, found Triton {version}"
    options = getattr(getattr(interpreter, "interpreter_builder", None), "options", None)
    fields = {f.name for f in dataclasses.fields(options)} if dataclasses.is_dataclass(options) else set()
    found = {"_patch_lang": hasattr(interpreter, "_patch_lang"),
             "_LangPatchScope": hasattr(interpreter, "_LangPatchScope"),
             "GridExecutor.__call__": "__call__" in vars(getattr(interpreter, "GridExecutor", object)),
             "interpreter_builder.options.debug": "debug" in fields,
             "interpreter_builder.options.sanitize_overflow": "sanitize_overflow" in fields}
    missing = [name for name, present in found.items() if not present]
    if missing:
        return f"Triton {version}'s interpreter has no {', '.join(missing)}"
    return None


def _say_once(problem):
    global _said
    if not _said:
        _said = True
        print(f"coursekit.fast_interpreter: {problem}; Triton's interpreter runs as shipped "
              "(the same results, more slowly).", file=sys.stderr)
