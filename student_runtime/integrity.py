"""The grader's code inside a student's process, held as it was loaded.

The template process loads the measuring helpers (student_runtime, coursekit)
before any student code exists and takes a snapshot of them: every module's
names, every function's code and defaults, every class's attributes. The
server resolves the helpers the grader asks for from this snapshot, never by
looking a name up at the time of the request, so `probes.x = fake` in a cell
does not reach a measurement. Before and after every request it compares the
modules with the snapshot, puts back whatever was changed and reports the
change through the audit pipe (student_runtime.audit), where the grader reads
it: a check whose call saw such a change earns nothing.

This raises the bar; it is not a wall. Code in the same process can reach any
object through the garbage collector or frames (the tripwire flags those), so
the judgements that matter are made outside the process wherever they can be:
memory by cgroup, NumPy-only by a process without PyTorch, decoding steps by
the grader's own callback."""
import sys
import types

OWN_PACKAGES = ("student_runtime", "coursekit")


class Snapshot:
    def __init__(self):
        self.modules = {}    # name -> (module, dict copy)
        self.functions = {}  # function -> (code, defaults, kwdefaults)
        self.classes = {}    # class -> dict copy
        for name, module in list(sys.modules.items()):
            if isinstance(module, types.ModuleType) and name.split(".")[0] in OWN_PACKAGES:
                self._take(name, module)

    def _take(self, name, module):
        namespace = dict(vars(module))
        self.modules[name] = (module, namespace)
        for value in namespace.values():
            if getattr(value, "__module__", None) != name:
                continue
            if isinstance(value, types.FunctionType):
                self._function(value)
            elif isinstance(value, type):
                self.classes[value] = dict(vars(value))
                for member in vars(value).values():
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if isinstance(member, types.FunctionType):
                        self._function(member)

    def _function(self, fn):
        self.functions[fn] = (fn.__code__, fn.__defaults__, fn.__kwdefaults__)

    def resolve(self, spec):
        """The object named 'module:qualname' as it was when the snapshot was taken."""
        module, _, qualname = spec.partition(":")
        if module not in self.modules:
            raise LookupError(f"{module} is not one of the grader's helper modules")
        parts = qualname.split(".")
        target = self.modules[module][1].get(parts[0])
        for part in parts[1:]:
            target = self.classes.get(target, {}).get(part) if isinstance(target, type) else None
        if target is None:
            raise LookupError(f"no helper {spec}")
        return target

    def restore(self):
        """Put back what was changed since the snapshot; returns what was changed."""
        changed = []
        for name, (module, namespace) in self.modules.items():
            current = vars(module)
            for key, value in namespace.items():
                if current.get(key, _MISSING) is not value:
                    changed.append(f"{name}.{key}")
                    current[key] = value
            for key in [k for k, v in current.items() if k not in namespace and not k.startswith("__")
                        and not isinstance(v, types.ModuleType)]:
                changed.append(f"{name}.{key}")  # added (a submodule imported later, a warnings registry: no change)
                del current[key]
            if sys.modules.get(name) is not module:
                changed.append(f"sys.modules[{name!r}]")
                sys.modules[name] = module
        for cls, attributes in self.classes.items():
            current = vars(cls)
            for key, value in attributes.items():
                if current.get(key, _MISSING) is not value:
                    changed.append(f"{cls.__module__}.{cls.__qualname__}.{key}")
                    type.__setattr__(cls, key, value)
            for key in [k for k in current if k not in attributes]:
                changed.append(f"{cls.__module__}.{cls.__qualname__}.{key}")
                type.__delattr__(cls, key)
        for fn, (code, defaults, kwdefaults) in self.functions.items():
            if fn.__code__ is not code or fn.__defaults__ is not defaults or fn.__kwdefaults__ is not kwdefaults:
                changed.append(f"{fn.__module__}.{fn.__qualname__}.__code__")
                fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
        return changed


_MISSING = object()
