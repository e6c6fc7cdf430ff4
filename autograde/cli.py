"""Command line: `python -m autograde generate` and `python -m autograde grade`."""
import argparse
import sys

from autograde.course import CourseError


def _generate(args):
    from autograde.generate import regenerate_exercises

    for path in regenerate_exercises():
        print(f"wrote {path}")
    return 0


def _grade(args):
    from autograde.grade import grade

    # Every submission gets a row in grades.csv, failed ones with the reason;
    # one student's failure is not the command's.
    grade(args.assignment, args.submissions, args.out, cell_timeout=args.timeout)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograde", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="regenerate exercises/ from solutions/ with nbgrader")
    gen.set_defaults(run=_generate)

    grd = sub.add_parser("grade", help="autograde a folder of submissions and write grades.csv and feedback")
    grd.add_argument("assignment", help="assignment name, a folder of solutions/ (e.g. ch1_principles)")
    grd.add_argument("submissions", help="folder in nbgrader's layout, <student>/<assignment>/*.ipynb, or a zip "
                                         "of notebooks named <student>_<anything>.ipynb as LMSs export them")
    grd.add_argument("--out", default=None,
                     help="folder for the gradebook, grades.csv and feedback (default: grading/<assignment>)")
    grd.add_argument("--timeout", type=int, default=None, help="seconds a single cell may run (default 120)")
    grd.set_defaults(run=_grade)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except CourseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unwritable output folder, full disk: say which file
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
