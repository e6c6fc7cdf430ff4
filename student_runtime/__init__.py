"""The grader's code that runs inside a student's sandboxed process: the
request server, the plain-data wire, and the measurements that must be taken
where the student's code runs (peak memory, kernel traces, call counts).

It holds no answer and no test. It is importable inside the sandbox, where
the instructor-only package `autograde` is not; it is not part of the student
release, which has no use for it."""
