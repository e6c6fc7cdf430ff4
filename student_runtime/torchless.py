"""The student process in which PyTorch does not exist.

The exercises graded as NumPy code are graded in a second student process,
forked from a template that never imported PyTorch and whose sandbox hides
PyTorch's files (autograde.sandbox), so that no thread, dispatch mode or
cleverness can reach it. The notebooks' own cells still say `import torch`
(the setup cells do, for the visible tests), so `import torch` and its
submodules succeed here, giving stand-ins: any use of one raises
TorchUnavailable, a clear message, and reports the use through the audit pipe
(the grader counts it only when it happens during a graded call)."""
import importlib.abc
import importlib.machinery
import sys
import types

# Packages that are PyTorch or need it.
BLOCKED = ("torch", "functorch", "torchvision", "torchaudio", "torchgen", "triton")
USE = "uses PyTorch where the answer is graded as NumPy code"


class TorchUnavailable(AttributeError):
    """PyTorch was used where the answer is graded as NumPy code."""


def _blocked(name):
    return name.split(".")[0] in BLOCKED


class _StandIn(types.ModuleType):
    """What `import torch` (or `from torch.x import y`) gives here."""

    def __getattr__(self, attribute):
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)  # what the import system and libraries probe for
        raise _unavailable(f"{self.__name__}.{attribute}")

    def __call__(self, *args, **kwargs):
        raise _unavailable(self.__name__)


_audit = sys.audit  # before any student code could rebind it


def _unavailable(where):
    _audit("student_runtime.report", USE, where)
    return TorchUnavailable(
        f"{where}: PyTorch is not available here. This function is graded as NumPy code, in a process "
        "where PyTorch cannot be imported: compute with NumPy (or plain Python) instead.")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if _blocked(name):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install():
    """From now on, PyTorch and what needs it import as stand-ins."""
    loaded = [name for name in sys.modules if _blocked(name)]
    if loaded:
        raise RuntimeError(f"{loaded[0]} was imported before PyTorch was blocked")
    sys.meta_path.insert(0, _Finder())


def active():
    """Whether this process is the one without PyTorch."""
    return isinstance(sys.modules.get("torch"), _StandIn) or any(isinstance(f, _Finder) for f in sys.meta_path)
