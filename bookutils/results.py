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
    details = ", ".join(f"{k} {device[k]}" for k in ("driver", "cuda") if device.get(k))
    return f"{device['name']}{f' ({details})' if details else ''}, {record['date'][:10]} UTC"
