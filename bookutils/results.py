"""Benchmark results as data: `./scripts/benchmark --save FILE` writes one JSON
file with every row and where and when they were measured (device, driver,
library versions, date); the book's benchmark page plots the files committed
under book/flash/results/. A file records exactly what one run printed."""
import datetime
import json
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


def environment():
    """Where and when: the device, its driver, the library versions, the date (UTC)."""
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
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


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
    """Where and when, in words: 'NVIDIA H100 80GB HBM3 (driver 550.54, CUDA 12.4), 2026-05-01 UTC'."""
    device = record["device"]
    details = ", ".join(f"{word} {device[k]}" for k, word in (("driver", "driver"), ("cuda", "CUDA")) if device.get(k))
    return f"{device['name']}{f' ({details})' if details else ''}, {record['date'][:10]} UTC"


def gpu_records(folder=RESULTS_DIR):
    """The committed files measured on a GPU, as (file name, record)."""
    return [(name, record) for name, record in load(folder) if record["device"]["type"] == "cuda"]


def forward_figure(records):
    """One panel per (file name, record): forward TFLOP/s against N, a line per method,
    titled with where and when it was measured."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(records), figsize=(5.5 * len(records), 4.0), squeeze=False)
    for ax, (name, record) in zip(axes[0], records):
        rows = record["tables"].get("forward", [])
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["method"] == method]
            ax.plot([r["n"] for r in mine], [r["tflops"] for r in mine], "o-", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length $N$")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{label(record)}\ncausal={record['settings']['causal']} ({name})", fontsize=8)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
