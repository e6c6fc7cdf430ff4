"""The grader's view of coursekit.memory.traced_peak: a student's function is
measured in the student's own process, where its code runs."""
from coursekit.memory import traced_peak as _traced_peak_here


def traced_peak(fn, *args, **kwargs):
    """(result, peak bytes allocated during fn(*args, **kwargs)), measured in
    the student's process when a student object is among the arguments."""
    from autograde.sandbox import find_remote, in_student_process

    if find_remote([fn, *args, *kwargs.values()]) is not None:
        return in_student_process(_traced_peak_here, fn, *args, **kwargs)
    return _traced_peak_here(fn, *args, **kwargs)
