"""Benchmark results as data (bookutils.results): `--save` writes the device, the
driver, the versions, the date, the commit and every row; the benchmark page reads
back only the files measured on a GPU, labels each with where, when and with what,
and draws one panel per file. GPU files are made up here (no GPU): the page never
shows one unless it is committed. Files written before the commit was recorded
load and are labelled without it."""
import json
import shutil
import subprocess

import matplotlib
import pytest
import torch

from bookutils import results
from tests.conftest import REPO

matplotlib.use("Agg")


def _gpu_record(name, date, methods=("Triton kernel (this chapter)", "SDPA, FLASH_ATTENTION backend")):
    rows = [{"method": m, "n": n, "ms": 1.0, "tflops": 10.0 * (i + 1), "peak_mib": 1.0}
            for i, m in enumerate(methods) for n in (512, 1024)]
    return {"format": results.FORMAT, "date": date, "settings": {"causal": False, "dtype": "float16"},
            "device": {"type": "cuda", "name": name, "driver": "550.54", "cuda": "12.4"},
            "versions": {"torch": "x", "triton": "y"}, "tables": {"forward": rows}}


def test_save_records_where_and_when_and_every_row(tmp_path):
    tables = {"cpu_memory": [{"method": "naive PyTorch", "n": 128, "peak_bytes": 1, "scores_bytes": 2}]}
    record = results.save(tmp_path / "sub" / "run.json", tables, {"causal": True})
    again = json.loads((tmp_path / "sub" / "run.json").read_text())
    assert again == record and again["tables"] == tables and again["settings"] == {"causal": True}
    assert again["versions"]["torch"] == torch.__version__ and again["device"]["type"] in ("cpu", "cuda")
    assert again["date"].endswith("+00:00")                         # UTC, with the time
    assert again["commit"] == _head()                               # the checkout's HEAD, or None without git


def _head():
    git = shutil.which("git")
    if git is None:
        return None
    out = subprocess.run([git, "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def test_without_git_the_commit_is_none(monkeypatch):
    monkeypatch.setattr(results.shutil, "which", lambda name: None)
    monkeypatch.delenv("COURSE_COMMIT", raising=False)
    assert results.environment()["commit"] is None


def test_a_copy_without_git_records_the_commit_it_is_told(monkeypatch):
    """scripts/gpu-run names the commit for a tree copied without .git; a checkout's own HEAD wins."""
    monkeypatch.setenv("COURSE_COMMIT", "abc1234")
    assert results.environment()["commit"] == (_head() or "abc1234")
    monkeypatch.setattr(results.shutil, "which", lambda name: None)
    assert results.environment()["commit"] == "abc1234"


def test_only_gpu_files_are_read_back_oldest_first(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps(_gpu_record("NVIDIA H100 80GB HBM3", "2026-03-02T10:00:00+00:00")))
    (tmp_path / "a.json").write_text(json.dumps(_gpu_record("NVIDIA A100-SXM4-40GB", "2026-05-01T10:00:00+00:00")))
    cpu = _gpu_record("x86_64", "2026-01-01T00:00:00+00:00")
    cpu["device"] = {"type": "cpu", "name": "x86_64"}
    (tmp_path / "c.json").write_text(json.dumps(cpu))
    (tmp_path / "old.json").write_text(json.dumps({**cpu, "format": 0}))
    found = results.gpu_records(tmp_path)
    assert [name for name, _ in found] == ["b.json", "a.json"]
    assert results.label(found[0][1]) == ("NVIDIA H100 80GB HBM3 (driver 550.54, CUDA 12.4), 2026-03-02 UTC, "
                                          "PyTorch x, Triton y")            # no commit field: an older file


def test_the_label_says_the_commit_and_the_versions():
    record = {**_gpu_record("NVIDIA H200", "2026-11-28T18:19:33+00:00"), "commit": "934c292"}
    record["device"].update(driver="580.159.04", cuda="13.0")
    record["versions"] = {"torch": "2.11.0+cu130", "triton": "3.6.0"}
    assert results.label(record) == ("NVIDIA H200 (driver 580.159.04, CUDA 13.0), 2026-11-28 UTC, commit 934c292, "
                                     "PyTorch 2.11.0+cu130, Triton 3.6.0")


def test_the_committed_h200_files_load_with_their_commit():
    found = dict(results.gpu_records())
    for kind, causal in (("noncausal", False), ("causal", True)):
        record = found[f"2026-11-28-h200-{kind}.json"]
        assert record["commit"] == "934c292" and record["settings"]["causal"] is causal
        assert results.label(record).startswith("NVIDIA H200 (driver 580.159.04, CUDA 13.0), 2026-11-28 UTC, "
                                                "commit 934c292, PyTorch 2.11.0+cu130, Triton 3.6.0")
        assert {"forward", "forward_backward", "decode"} <= set(record["tables"])


def test_the_committed_results_figure_has_a_labelled_panel_per_file(tmp_path):
    records = [("h100.json", _gpu_record("NVIDIA H100", "2026-03-02T10:00:00+00:00")),
               ("a100.json", _gpu_record("NVIDIA A100", "2026-03-03T10:00:00+00:00", methods=("naive PyTorch",)))]
    fig = results.forward_figure(records)
    axes = fig.axes
    assert len(axes) == 2
    assert "NVIDIA H100" in axes[0].get_title() and "2026-03-02" in axes[0].get_title()
    assert [line.get_label() for line in axes[0].lines] == ["Triton kernel (this chapter)",
                                                            "SDPA, FLASH_ATTENTION backend"]
    assert list(axes[1].lines[0].get_ydata()) == [10.0, 10.0]


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_no_files_means_no_results(tmp_path, folder):
    path = tmp_path / folder
    if folder == "empty":
        path.mkdir()
    assert results.gpu_records(path) == []
