"""A Triton kernel as plain data: its source, the sources of the functions it
calls and the values of the globals it reads, so that a fresh Python process can
rebuild it and hand it to Triton's compiler.

Why another process: when Triton runs in its interpreter (TRITON_INTERPRET=1,
every machine without a GPU), `@triton.jit` makes interpreter objects, and the
interpreter rewires `triton.language` while kernels run. Triton's GPU compiler
cannot work in such a process; a process started without the interpreter can,
and a crash or a hang of the compiler stays in it.

`describe(kernel)` runs where the kernel was defined (a module, a notebook, the
grader's sandbox); `rebuild(description)` runs in the compiling process. Only
kernels and helpers written by the user travel as source; Triton's own functions,
and modules such as numpy or math, are imported by name; any other value a kernel
reads becomes an opaque stand-in, which the compiler rejects exactly as it
rejects the original (a kernel may only read constexpr globals)."""
import ast
import importlib
import inspect
import linecache
import sys
import textwrap
import types

# Modules the compiling process imports when a kernel refers to them; any other
# module becomes an empty stand-in (importing course modules there could switch
# Triton to its interpreter).
IMPORTABLE = ("triton", "numpy", "math", "torch", "cmath", "operator", "functools", "itertools")


def raw_function(kernel):
    """The Python function under @triton.jit, @triton.autotune, @triton.heuristics
    or the interpreter's wrapper."""
    fn = kernel
    while not inspect.isfunction(fn):
        inner = getattr(fn, "fn", None)
        if inner is None:
            raise TypeError(f"{kernel!r} is not a Triton kernel (no Python function inside)")
        fn = inner
    return fn


def _kind(obj):
    """'jit', 'constexpr_function', 'python' or None for something that is not a function."""
    names = {c.__name__ for c in type(obj).__mro__}
    if names & {"JITFunction", "InterpretedFunction", "Autotuner", "Heuristics"}:
        return "jit"
    if "ConstexprFunction" in names:
        return "constexpr_function"
    if inspect.isfunction(obj):
        return "python"
    return None


def _jit_options(obj):
    """The keyword arguments of @triton.jit that change compilation."""
    names = ("do_not_specialize", "do_not_specialize_on_alignment", "noinline", "debug")
    source = getattr(obj, "kwargs", None) or {n: getattr(obj, n, None) for n in names}
    options = {}
    for name in names:
        value = source.get(name)
        if value:
            options[name] = list(value) if isinstance(value, (list, tuple)) else value
    return options


def _importable(module, qualname, obj):
    """Whether `module`.`qualname` is obj, importable by name elsewhere."""
    if not module or module.split(".")[0] not in IMPORTABLE:
        return False
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found is obj


def _literal(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, tuple) and all(_literal(v) is not None for v in value):
        return {"tuple": [_literal(v) for v in value]}
    return None


def _names_read(fn, source):
    """Names a function's signature and body mention (decorators excluded: they are not rebuilt)."""
    tree = ast.parse(textwrap.dedent(source))
    node = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    parts = [node.args, *node.body] + ([node.returns] if node.returns else [])
    names = {n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)}
    return sorted(names | set(fn.__code__.co_freevars))


def _scope(fn):
    scope = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                scope[name] = cell.cell_contents
            except ValueError:      # a cell not yet filled
                pass
    return scope


def _describe_value(value, functions):
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    kind = _kind(value)
    if kind in ("jit", "constexpr_function"):
        fn = raw_function(value)
        if fn.__module__.split(".")[0] == "triton":          # Triton's own library, e.g. tl.sum
            return {"object": [fn.__module__, fn.__qualname__]}
        return {"function": _add(value, functions)}
    cls = type(value).__name__
    if cls == "constexpr" and type(value).__module__.startswith("triton"):
        inner = _literal(value.value)
        if inner is None and type(value.value).__name__ == "dtype":
            inner = {"dtype": str(value.value)}
        return {"constexpr": inner} if inner is not None else {"opaque": "constexpr"}
    if cls == "dtype" and type(value).__module__.startswith("triton"):
        return {"dtype": str(value)}
    literal = _literal(value)
    if literal is not None:
        return literal
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if isinstance(module, str) and isinstance(qualname, str) and _importable(module, qualname, value):
        return {"object": [module, qualname]}
    if kind == "python":
        return {"function": _add(value, functions)}
    return {"opaque": cls}


def _add(obj, functions):
    fn = raw_function(obj)
    key = f"{fn.__module__}:{fn.__qualname__}:{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
    if key in functions:
        return key
    lines, first = inspect.getsourcelines(fn)
    source = "".join(lines)
    entry = {"name": fn.__name__, "module": fn.__module__, "kind": _kind(obj), "options": _jit_options(obj),
             "filename": fn.__code__.co_filename, "firstlineno": first, "source": source, "globals": {}}
    functions[key] = entry
    scope = _scope(fn)
    for name in _names_read(fn, source):
        if name in scope:
            entry["globals"][name] = _describe_value(scope[name], functions)
    return key


def describe(kernel):
    """Plain data (str, numbers, lists, dicts) from which rebuild() makes the kernel again."""
    functions = {}
    root = _add(kernel, functions)
    return {"root": root, "functions": functions}


# ---------------------------------------------------------------- in the compiling process

class HostObject:
    """Stands in for a value a kernel reads but the compiling process cannot have."""

    def __init__(self, type_name):
        self.type_name = type_name

    def __repr__(self):
        return f"<{self.type_name} object>"


def _value(spec, made):
    import triton.language as tl

    if "value" in spec:
        return spec["value"]
    if "tuple" in spec:
        return tuple(_value(v, made) for v in spec["tuple"])
    if "dtype" in spec:
        return tl.dtype(spec["dtype"])
    if "constexpr" in spec:
        return tl.constexpr(_value(spec["constexpr"], made))
    if "function" in spec:
        return made[spec["function"]]
    if "module" in spec:
        name = spec["module"]
        if name.split(".")[0] in IMPORTABLE:
            try:
                return importlib.import_module(name)
            except ImportError:
                pass
        return types.ModuleType(name)
    if "object" in spec:
        module, qualname = spec["object"]
        try:
            found = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
            return found
        except (ImportError, AttributeError):
            return HostObject(qualname)
    return HostObject(spec.get("opaque", "unknown"))


def _register_sources(functions):
    """Put each function's lines into linecache at their original line numbers, so
    that inspect (which @triton.jit uses) finds them and messages cite real lines."""
    files = {}
    for entry in functions.values():
        lines = entry["source"].splitlines(keepends=True)
        file_lines = files.setdefault(entry["filename"], [])
        end = entry["firstlineno"] - 1 + len(lines)
        file_lines.extend(["\n"] * (end - len(file_lines)))
        file_lines[entry["firstlineno"] - 1:end] = lines
    for filename, lines in files.items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def rebuild(description):
    """The root kernel as a triton JITFunction, with every function it calls rebuilt."""
    import triton
    from triton.runtime.jit import JITFunction

    functions = description["functions"]
    _register_sources(functions)
    namespaces, plain = {}, {}
    for key, entry in functions.items():
        tree = ast.parse(textwrap.dedent(entry["source"]))
        node = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        node.decorator_list = []
        module = ast.Module(body=[node], type_ignores=[])
        ast.increment_lineno(module, entry["firstlineno"] - 1)
        namespace = {"__name__": entry["module"], "__builtins__": __builtins__}
        namespaces[key] = namespace
        plain[key] = (namespace, compile(module, entry["filename"], "exec"), node.name)
    made = {}
    for key, entry in functions.items():
        # signatures may read globals (tl.constexpr annotations): fill those that need no other function
        namespace, code, name = plain[key]
        for gname, spec in entry["globals"].items():
            if "function" not in spec:
                namespace[gname] = _value(spec, made)
        exec(code, namespace)
        fn = namespace[name]
        kind = entry["kind"]
        if kind == "jit":
            made[key] = JITFunction(fn, **entry["options"])
        elif kind == "constexpr_function":
            made[key] = triton.constexpr_function(fn)
        else:
            made[key] = fn
    for key, entry in functions.items():
        namespace = plain[key][0]
        for gname, spec in entry["globals"].items():
            if "function" in spec:
                namespace[gname] = made[spec["function"]]
        namespace[plain[key][2]] = made[key]
    return made[description["root"]]
