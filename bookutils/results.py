"""Benchmark results as data: `./scripts/benchmark --save FILE` writes one JSON
file with every row and where, when and with what they were measured (device,
driver, library versions, date, and the commit of the course's code that ran);
the book's benchmark page plots the files committed under book/flash/results/.
A file records exactly what one run printed. Files written before the commit was
recorded have no "commit" field and load all the same."""
import datetime
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

FORMAT = 1
RESULTS_DIR = Path(__file__).resolve().parent.parent / "book" / "flash" / "results"


def _driver_version():
    """The NVIDIA driver's version from nvidia-smi, or None where there is none."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _commit():
    """The short hash of the checkout's HEAD; where it is not a git repository or
    git is missing (a GPU machine may run a copy of the tree with PYTHONPATH
    alone), the COURSE_COMMIT environment variable (set by scripts/gpu-run), else None."""
    tool = shutil.which("git")
    if tool is not None:
        try:
            out = subprocess.run([tool, "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                                 capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return os.environ.get("COURSE_COMMIT") or None


def environment():
    """Where, when and with what: the device, its driver, the library versions,
    the date (UTC) and the commit of the code (None where unknown)."""
    import numpy
    import triton

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = {"type": "cuda", "name": props.name, "capability": f"{props.major}.{props.minor}",
                  "multiprocessors": props.multi_processor_count, "memory_gib": round(props.total_memory / 2**30, 1),
                  "driver": _driver_version(), "cuda": torch.version.cuda}
    else:
        device = {"type": "cpu", "name": platform.processor() or platform.machine()}
    return {"device": device,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "triton": triton.__version__, "numpy": numpy.__version__},
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": _commit()}


def save(path, tables, settings):
    """Write {'format', 'settings', 'tables': {name: [row, ...]}, plus environment()} to path."""
    record = {"format": FORMAT, **environment(), "settings": settings, "tables": tables}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n")
    return record


def load(folder=RESULTS_DIR):
    """Every results file in folder, oldest first, as (file name, record)."""
    found = []
    for path in sorted(Path(folder).glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("format") == FORMAT:
            found.append((path.name, record))
    return sorted(found, key=lambda item: item[1]["date"])


def label(record):
    """Where, when and with what, in words: 'NVIDIA H200 (driver 580.159.04, CUDA 13.0),
    2026-11-28 UTC, commit 934c292, PyTorch 2.11.0+cu130, Triton 3.6.0'. The commit and
    the versions are left out where the file has none."""
    device = record["device"]
    details = ", ".join(f"{word} {device[k]}" for k, word in (("driver", "driver"), ("cuda", "CUDA")) if device.get(k))
    versions = record.get("versions", {})
    parts = [f"{device['name']}{f' ({details})' if details else ''}", f"{record['date'][:10]} UTC"]
    if record.get("commit"):
        parts.append(f"commit {record['commit']}")
    parts += [f"{name} {versions[key]}" for key, name in (("torch", "PyTorch"), ("triton", "Triton"))
              if versions.get(key)]
    return ", ".join(parts)


def gpu_records(folder=RESULTS_DIR):
    """The committed files measured on a GPU, as (file name, record)."""
    return [(name, record) for name, record in load(folder) if record["device"]["type"] == "cuda"]


def forward_figure(records):
    """One panel per (file name, record): forward TFLOP/s against N, a line per method,
    titled with where and when it was measured."""
    from bookutils.plotting import legend_below, panel_grid

    fig, axes = panel_grid(len(records), 3.7, 3.6)
    methods = list(dict.fromkeys(r["method"] for _, record in records for r in record["tables"].get("forward", [])))
    colours = {method: f"C{i}" for i, method in enumerate(methods)}   # a method's colour is the same in every panel
    for ax, (name, record) in zip(axes.flat, records):
        rows = record["tables"].get("forward", [])
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["method"] == method]
            ax.plot([r["n"] for r in mine], [r["tflops"] for r in mine], "o-", color=colours[method], label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length $N$")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        where, _, what = label(record).partition(" UTC, ")     # two lines: where and when, then with what
        title = f"{where} UTC\n{what}" if what else where
        ax.set_title(f"{title}\ncausal={record['settings']['causal']} ({name})", fontsize=7.5)
        ax.grid(True, alpha=0.3)
    legend_below(fig, axes.flat[:len(records)], ncol=2)
    return fig
