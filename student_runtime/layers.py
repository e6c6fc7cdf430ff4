"""PyTorch's own attention layers, marked in the student's process.

Chapter 2's DecoderLayer must write its attention blocks itself. Before any
student code runs, the template replaces each of PyTorch's attention layers
(the functions and the fused operators they may reach) by a stand-in that
reports the call through the audit pipe (student_runtime.audit) and then
runs the layer. The report is written by whichever thread makes the call and
lands in a pipe the student's code cannot rewind, and the grader reads the
pipe before and after each graded call: a layer that ran in between, from any
thread, ran during that call. Aliases taken later (`from torch.nn.functional
import multi_head_attention_forward`, a subclass, a module built in a cell)
all reach the stand-ins."""
import importlib
import sys

REPORT = "runs PyTorch's attention layer"
# (module, attribute path): Python functions and the Python names of the fused operators.
LAYERS = (("torch.nn.functional", "multi_head_attention_forward"),
          ("torch.nn.modules.activation", "MultiheadAttention.forward"),
          ("torch.nn.modules.transformer", "TransformerDecoderLayer.forward"),
          ("torch.nn.modules.transformer", "TransformerEncoderLayer.forward"),
          ("torch.nn.modules.transformer", "TransformerDecoder.forward"),
          ("torch.nn.modules.transformer", "TransformerEncoder.forward"),
          ("torch.nn.modules.transformer", "Transformer.forward"),
          ("torch", "_native_multi_head_attention"),
          ("torch", "_transformer_encoder_layer_fwd"),
          ("torch", "_transformer_decoder_only_layer_fwd"))


def _marked(original, name, audit):
    def layer(*args, **kwargs):
        audit("student_runtime.report", REPORT, name)
        return original(*args, **kwargs)
    layer.__name__ = getattr(original, "__name__", name)
    layer.__qualname__ = getattr(original, "__qualname__", name)
    layer.__doc__ = getattr(original, "__doc__", None)
    return layer


def _layers():
    """(owner, attribute, original, path) for every layer of LAYERS this PyTorch has."""
    for module_name, path in LAYERS:
        try:
            owner = importlib.import_module(module_name)
        except ImportError:
            continue
        *parents, attribute = path.split(".")
        for part in parents:
            owner = getattr(owner, part, None)
        original = getattr(owner, attribute, None)
        if original is not None:
            yield owner, attribute, original, path


def install():
    """Mark every layer of LAYERS that this PyTorch has; returns their names."""
    audit = sys.audit
    marked = []
    for owner, attribute, original, path in list(_layers()):
        setattr(owner, attribute, _marked(original, path, audit))
        marked.append(path)
    return marked


class recorded_here:
    """For the duration of a `with`, every layer of LAYERS records its name in a
    list, in this process: the same marks for a local call (the grader's own
    tests of its checks), where no audit pipe is read. The originals are put back
    afterwards."""

    def __enter__(self):
        self.seen, self._restore = [], []
        for owner, attribute, original, path in list(_layers()):
            self._restore.append((owner, attribute, original))
            setattr(owner, attribute, _marked(original, path, lambda event, what, name: self.seen.append(name)))
        return self.seen

    def __exit__(self, *exc):
        for owner, attribute, original in reversed(self._restore):
            setattr(owner, attribute, original)
        return False
