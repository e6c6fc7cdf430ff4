"""Counting processes from /proc: the grader's watchdog and the sandbox's
template, which ends what a student left running, read them the same way."""
import os


def count_processes(uid=None, session=None, zombies=False):
    """Processes of a user (uid) or in a session (its leader's pid), from /proc."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                state, _, pgrp = fh.read().rpartition(")")[2].split()[:3]
            if state in "ZX" and not zombies:
                continue
            if uid is not None:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            else:
                count += int(pgrp) == session
        except (OSError, ValueError):
            pass
    return count
