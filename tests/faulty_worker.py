"""A stand-in for autograde.worker.grade_student (importable, so a process pool
can send it to its workers): grades normally, except that the student named in
FAULTY_STUDENT meets the failure named in FAULT: a grader bug, or a worker
process that dies."""
import os

from autograde import worker


def grade_student(job):
    if job.student == os.environ.get("FAULTY_STUDENT"):
        if os.environ.get("FAULT") == "bug":
            raise RuntimeError("a bug in the grader")
        os._exit(1)
    return worker.grade_student(job)
