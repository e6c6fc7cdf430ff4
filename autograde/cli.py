"""Command line: `python -m autograde generate`, `grade`, `release` and `gradescope`."""
import argparse
import sys

from autograde.course import CourseError


def _generate(args):
    from autograde.generate import regenerate_exercises

    for path in regenerate_exercises():
        print(f"wrote {path}")
    return 0


def _release(args):
    from autograde.release import write_release

    out = write_release(args.destination)
    print(f"wrote the student release to {out}\n"
          f"check it with: (cd {out} && ./scripts/test), then commit and push it to the public repository")
    return 0


def _grade(args):
    from autograde.grade import grade

    from autograde.course import CELL_TIMEOUT_S
    from autograde.grade import EnvironmentProblem
    from autograde.sandbox import Limits

    # Every submission gets a row in grades.csv, failed ones with the reason;
    # one student's failure is not the command's. A broken grading machine or
    # a bug in the grader is, and says so with a non-zero status.
    try:
        limits = Limits(call_timeout_s=args.timeout or CELL_TIMEOUT_S)
        limits.isolate = not args.no_namespaces
        if args.memory_limit is not None:
            limits.memory_bytes = args.memory_limit * 2**20
        summary = grade(args.assignment, args.submissions, args.out, cell_timeout=args.timeout,
                        notebook_timeout=args.notebook_timeout, workers=args.workers, limits=limits)
    except EnvironmentProblem as exc:
        print(f"error: the grading environment is broken, so nothing was recorded for the students not yet "
              f"graded: {exc}\nFix the environment (run ./scripts/grade from the course repository, which "
              "installs its dependencies) and run the same command again.", file=sys.stderr)
        return 3
    return 4 if summary.count("error") else 0


def _gradescope(args):
    from autograde.gradescope.build import build, points

    zip_path = build(args.assignment, args.out, hidden_visibility=args.hidden_visibility,
                     isolate=not args.no_namespaces, cell_timeout=args.timeout,
                     notebook_timeout=args.notebook_timeout, memory_limit_mib=args.memory_limit)
    auto, manual = points(args.assignment)
    print(f"wrote {zip_path}\n"
          f"Upload it as the autograder of a Gradescope programming assignment (base image Ubuntu 22.04) worth "
          f"{auto:g} autograded points" + (f", and add a manually graded question of {manual:g} points for the "
                                          "written answers" if manual else "") + ".")
    if args.no_namespaces:
        print("warning: --no-namespaces: student code will run with process limits only and can read the "
              "autograder's files, hidden checks and solutions included")
    return 0


def _limit_options(parser, notebook_help, no_namespaces_help):
    """The options that bound a student's run, shared by grading here and on Gradescope."""
    parser.add_argument("--timeout", type=int, default=None,
                        help="seconds a single cell (or one call of a student function) may run (default 120)")
    parser.add_argument("--notebook-timeout", type=int, default=None, help=notebook_help)
    parser.add_argument("--memory-limit", type=int, default=None, metavar="MIB",
                        help="address space a student's process may use, in MiB (default 4096)")
    parser.add_argument("--no-namespaces", action="store_true", help=no_namespaces_help)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograde", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="regenerate exercises/ from solutions/ with nbgrader")
    gen.set_defaults(run=_generate)

    rel = sub.add_parser("release", help="write the student release (book, exercises, no answers) into a folder")
    rel.add_argument("destination", help="folder outside this repository, e.g. a clone of the public repository")
    rel.set_defaults(run=_release)

    grd = sub.add_parser("grade", help="autograde a folder of submissions and write grades.csv and feedback")
    grd.add_argument("assignment", help="assignment name, a folder of solutions/ (e.g. ch1_principles)")
    grd.add_argument("submissions", help="folder in nbgrader's layout, <student>/<assignment>/*.ipynb, or a zip "
                                         "of notebooks named <student>_<anything>.ipynb as LMSs export them")
    grd.add_argument("--out", default=None,
                     help="folder for the gradebook, grades.csv and feedback (default: grading/<assignment>)")
    _limit_options(grd, notebook_help="seconds a whole notebook may run before its remaining cells score 0 "
                                      "(default 1800)",
                   no_namespaces_help="grade where namespaces cannot be made (no bubblewrap, user namespaces off): "
                                      "student code then runs with process limits only and can read what this user "
                                      "can read")
    grd.add_argument("--workers", type=int, default=None,
                     help="students graded at the same time (default: the number of CPU cores)")
    grd.set_defaults(run=_grade)

    gsc = sub.add_parser("gradescope", help="write a Gradescope autograder (autograder.zip) for one assignment")
    gsc.add_argument("assignment", help="assignment name, a folder of solutions/ (e.g. ch1_principles)")
    gsc.add_argument("--out", required=True, help="folder to write autograder.zip into")
    gsc.add_argument("--hidden-visibility", default="after_published",
                     choices=["visible", "after_due_date", "after_published", "hidden"],
                     help="when students see the results of hidden tests (default: after_published, when you "
                          "publish the grades); visible tests are always shown")
    _limit_options(gsc, notebook_help="seconds a whole notebook may run (default 1800; keep it below "
                                      "Gradescope's timeout)",
                   no_namespaces_help="for containers where bubblewrap cannot make namespaces: student code then "
                                      "runs with process limits only and can read the autograder's files, hidden "
                                      "checks included")
    gsc.set_defaults(run=_gradescope)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except CourseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unwritable output folder, full disk: say which file
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
