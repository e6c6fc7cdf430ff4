"""Throughput of the grading command against plain, serial `nbgrader autograde`
on the same submissions.

    python -m autograde.benchmark [--assignment ch1_principles] [--students 12] [--repeat 3]

The class is the instructor's solutions filled into the student notebook, half
of them with one answer broken (so that failures, and their tracebacks, are
part of the work). nbgrader is timed on `nbgrader autograde` alone, in a course
folder prepared beforehand; the grading command is timed whole (it also
prepares its folder, validates structure, sandboxes and writes feedback)."""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograde.course import REPO, config_file_text, nbgrader_config, solution_code, source_notebooks


def _answers(source):
    answers = {}
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            answers[meta["grade_id"]] = solution_code(cell)
    return answers


def make_class(assignment, students, folder):
    """`students` submissions in nbgrader's layout under `folder`."""
    for path in source_notebooks(assignment):
        source = nbformat.read(path, as_version=4)
        answers = _answers(source)
        broken_order = sorted(answers)
        for i in range(students):
            nb = nbformat.read(REPO / "exercises" / assignment / path.name, as_version=4)
            broken = broken_order[i % len(broken_order)] if i % 2 else None
            for cell in nb.cells:
                gid = cell.metadata.get("nbgrader", {}).get("grade_id")
                if gid in answers:
                    cell.source = "raise ValueError('not done')" if gid == broken else answers[gid]
            target = Path(folder) / f"student{i:03d}" / assignment
            target.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, target / path.name)


def _timed(command, cwd):
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command))} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started


def time_nbgrader(assignment, submitted, work):
    course = Path(work) / "nbgrader"
    shutil.rmtree(course, ignore_errors=True)
    (course / "source" / assignment).mkdir(parents=True)
    for path in source_notebooks(assignment):
        shutil.copy2(path, course / "source" / assignment / path.name)
    shutil.copytree(submitted, course / "submitted")
    config = nbgrader_config(course.resolve(), db_url=f"sqlite:///{(course / 'gradebook.db').resolve()}")
    (course / "nbgrader_config.py").write_text(config_file_text(config))
    nbgrader = [sys.executable, "-m", "nbgrader"]
    _timed(nbgrader + ["generate_assignment", assignment, "--force"], course)
    return _timed(nbgrader + ["autograde", assignment, "--force"], course)


def time_command(assignment, submitted, work, workers):
    out = Path(work) / f"graded-{workers}"
    shutil.rmtree(out, ignore_errors=True)
    return _timed([sys.executable, "-m", "autograde", "grade", assignment, str(submitted), "--out", str(out),
                   "--workers", str(workers)], REPO)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assignment", default="ch1_principles")
    parser.add_argument("--students", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        submitted = Path(work) / "submitted"
        make_class(args.assignment, args.students, submitted)
        runs = {"nbgrader autograde (serial)": [], f"grading command, {args.workers} workers": []}
        for _ in range(args.repeat):  # interleaved, so drifts in machine load hit both alike
            runs["nbgrader autograde (serial)"].append(time_nbgrader(args.assignment, submitted, work))
            runs[f"grading command, {args.workers} workers"].append(
                time_command(args.assignment, submitted, work, args.workers))
    medians = {name: statistics.median(times) for name, times in runs.items()}
    print(f"{args.students} submissions of {args.assignment}, {os.cpu_count()} CPU cores, "
          f"median of {args.repeat} runs")
    for name, times in runs.items():
        print(f"  {name:<34} {medians[name]:7.1f} s   ({', '.join(f'{t:.1f}' for t in times)})")
    base, ours = medians.values()
    print(f"  speed-up: {base / ours:.2f}x ({args.students / ours:.2f} submissions/s against "
          f"{args.students / base:.2f})")


if __name__ == "__main__":
    main()
