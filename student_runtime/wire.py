"""Plain data between the grader and a sandboxed student process.

Only data crosses: JSON headers plus NumPy arrays as `.npy` bytes, read back
with `allow_pickle=False`. Nothing is ever unpickled, so no object made by
student code can reach the grader. Values that are not data (a student's
class instance, a callable passed by a test) are replaced by markers that the
caller turns into handles or callbacks (`on_other` / `on_marker`).

A frame on a pipe is: 8-byte big-endian header length, the JSON header, then
for each blob an 8-byte length and the bytes."""
import io
import json
import math
import struct

import numpy as np

MAX_FRAME_BYTES = 512 * 2**20  # far above any test's data; stops a flood from exhausting memory


class WireError(Exception):
    """Malformed, oversized or forbidden data from the other side."""


# ------------------------------------------------------------------ values

def real_torch():
    """PyTorch, if this process imported it (tensors cannot exist otherwise);
    None where it is only a stand-in (student_runtime.torchless), which has no file."""
    import sys
    torch = sys.modules.get("torch")
    return torch if getattr(torch, "__file__", None) else None


_torch = real_torch


def _npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _load_npy(data):
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # bad header, object dtype, truncated data
        raise WireError(f"not a plain .npy array ({exc})") from None


def _encode_float(x):
    x = float(x)
    return x if math.isfinite(x) else {"$": "float", "v": repr(x)}


def _encode_tensor(t, blobs):
    torch = _torch()
    storage_items = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.as_strided(t.detach(), (storage_items,), (1,), 0)
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: ship the bits
        flat = flat.view(torch.int16)
    blobs.append(_npy_bytes(flat.cpu().numpy()))
    return {"$": "tensor", "i": len(blobs) - 1, "dtype": dtype, "shape": list(t.shape),
            "stride": list(t.stride()), "offset": t.storage_offset(), "device": t.device.type}


def encode(value, blobs, on_other):
    """JSON-able form of `value`; arrays go to `blobs`. `on_other(value)` gives
    the marker for anything that is not plain data."""
    if isinstance(value, np.generic) and not isinstance(value, np.object_):  # before float: np.float64 is one
        return {"$": "npscalar", "dtype": value.dtype.str,
                "v": encode(value.item(), blobs, on_other) if not isinstance(value, np.complexfloating)
                else [_encode_float(value.real), _encode_float(value.imag)]}
    if value is None or isinstance(value, (bool, str)):
        return str(value) if isinstance(value, str) else bool(value) if value is not None else None
    if isinstance(value, int):
        return int(value)  # a subclass (with its own ==) arrives as a plain int
    if isinstance(value, float):
        return _encode_float(value)
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        blobs.append(_npy_bytes(value))
        return {"$": "nd", "i": len(blobs) - 1}
    if isinstance(value, complex):
        return {"$": "complex", "v": [_encode_float(value.real), _encode_float(value.imag)]}
    torch = _torch()
    if torch is not None:
        if isinstance(value, torch.Tensor) and type(value) in (torch.Tensor, torch.nn.Parameter) \
                and value.layout == torch.strided:
            return _encode_tensor(value, blobs)
        if isinstance(value, torch.Size):
            return {"$": "size", "v": [int(n) for n in value]}
        if isinstance(value, torch.dtype):
            return {"$": "tdtype", "v": str(value).removeprefix("torch.")}
    if isinstance(value, np.random.Generator) and type(value.bit_generator) is np.random.PCG64:
        return {"$": "rng", "state": value.bit_generator.state}
    if type(value) in (tuple, list, set, frozenset):
        return {"$": type(value).__name__, "v": [encode(v, blobs, on_other) for v in value]}
    if type(value) is dict and all(isinstance(k, str) for k in value):
        return {"$": "dict", "v": {k: encode(v, blobs, on_other) for k, v in value.items()}}
    if type(value) is slice:
        return {"$": "slice", "v": [encode(x, blobs, on_other) for x in (value.start, value.stop, value.step)]}
    return on_other(value)


def _decode_tensor(obj, blobs):
    torch = _torch()
    if torch is None:
        import torch  # noqa: F811  (a tensor arrived, so torch is needed to rebuild it)
    flat = torch.from_numpy(_load_npy(blobs[obj["i"]]).copy())
    dtype = getattr(torch, obj["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise WireError(f"unknown tensor dtype {obj['dtype']!r}")
    if dtype == torch.bfloat16:
        flat = flat.view(torch.bfloat16)
    elif flat.dtype != dtype:
        raise WireError(f"tensor data of dtype {flat.dtype} declared as {dtype}")
    shape, stride, offset = obj["shape"], obj["stride"], obj["offset"]
    needed = offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1 if all(shape) else 0
    if needed > flat.numel() or min(stride, default=0) < 0 or offset < 0:
        raise WireError("tensor shape and strides reach outside its data")
    t = torch.as_strided(flat, shape, stride, offset)
    device = obj.get("device", "cpu")
    return t if device == "cpu" else t.to(device)


def decode(obj, blobs, on_marker):
    """Inverse of encode. `on_marker(obj)` rebuilds the caller's own markers."""
    if obj is None or isinstance(obj, (bool, str, int, float)):
        return obj
    if isinstance(obj, list):
        raise WireError("bare list in data")
    if not isinstance(obj, dict) or "$" not in obj:
        raise WireError(f"unexpected value {str(obj)[:80]!r}")
    tag = obj["$"]
    if tag == "float":
        return float(obj["v"])
    if tag == "nd":
        return _load_npy(blobs[obj["i"]])
    if tag == "npscalar":
        dtype = np.dtype(obj["dtype"])
        if dtype.hasobject:
            raise WireError("object scalar")
        v = obj["v"]
        return dtype.type(complex(*map(lambda x: decode(x, blobs, on_marker), v)) if isinstance(v, list)
                          else decode(v, blobs, on_marker))
    if tag == "complex":
        return complex(*(decode(x, blobs, on_marker) for x in obj["v"]))
    if tag == "tensor":
        return _decode_tensor(obj, blobs)
    if tag == "size":
        import torch
        return torch.Size(int(n) for n in obj["v"])
    if tag == "tdtype":
        import torch
        dtype = getattr(torch, obj["v"], None)
        if not isinstance(dtype, torch.dtype):
            raise WireError(f"unknown torch dtype {obj['v']!r}")
        return dtype
    if tag == "rng":
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = obj["state"]
        return rng
    if tag in ("tuple", "list"):
        items = [decode(v, blobs, on_marker) for v in obj["v"]]
        return tuple(items) if tag == "tuple" else items
    if tag in ("set", "frozenset"):
        items = [decode(v, blobs, on_marker) for v in obj["v"]]
        try:
            return set(items) if tag == "set" else frozenset(items)
        except TypeError:  # only a forged frame puts an unhashable item in a set
            raise WireError("unhashable item in a set") from None
    if tag == "dict":
        return {str(k): decode(v, blobs, on_marker) for k, v in obj["v"].items()}
    if tag == "slice":
        return slice(*(decode(x, blobs, on_marker) for x in obj["v"]))
    return on_marker(obj)


# ------------------------------------------------------------------ frames

class Channel:
    """Length-prefixed frames over a pair of binary file objects."""

    def __init__(self, reader, writer, max_bytes=MAX_FRAME_BYTES):
        self.reader, self.writer, self.max_bytes = reader, writer, max_bytes

    def send(self, header, blobs=()):
        head = json.dumps(header, allow_nan=False).encode()
        parts = [struct.pack(">QQ", len(head), len(blobs)), head]
        for blob in blobs:
            parts += [struct.pack(">Q", len(blob)), blob]
        self.writer.write(b"".join(parts))
        self.writer.flush()

    def _read_exact(self, n):
        chunks, left = [], n
        while left:
            data = self.reader.read(left)
            if not data:
                raise EOFError("the other side closed the channel")
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)

    def receive(self):
        head_len, n_blobs = struct.unpack(">QQ", self._read_exact(16))
        if head_len > self.max_bytes or n_blobs > 100_000:
            raise WireError(f"frame header of {head_len} bytes with {n_blobs} arrays is too large")
        try:
            header = json.loads(self._read_exact(head_len))
        except (ValueError, RecursionError) as exc:  # RecursionError: nested past any real answer
            raise WireError(f"malformed JSON header ({type(exc).__name__})") from None
        blobs, total = [], head_len
        for _ in range(n_blobs):
            (size,) = struct.unpack(">Q", self._read_exact(8))
            total += size
            if total > self.max_bytes:
                raise WireError(f"frame over {self.max_bytes} bytes")
            blobs.append(self._read_exact(size))
        if not isinstance(header, dict):
            raise WireError("frame header is not an object")
        return header, blobs
