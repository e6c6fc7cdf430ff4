"""A progress bar with each student's status, one line per student (so it
reads the same in a terminal and in a log file)."""
import time

WIDTH = 20


class Progress:
    def __init__(self, total, log):
        self.total, self.log, self.done = total, log, 0
        self.started = time.monotonic()

    def step(self, result):
        self.done += 1
        filled = round(WIDTH * self.done / self.total)
        bar = "#" * filled + "." * (WIDTH - filled)
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * (self.total - self.done)
        manual = " + manual grading pending" if result.needs_manual_grade else ""
        flag = " [flagged for review]" if result.flagged else ""
        note = f" ({'; '.join(result.problems)})" if result.problems else ""
        self.log(f"[{bar}] {self.done}/{self.total} ~{left:.0f}s left  {result.student}: {result.status} "
                 f"{result.score:g}/{result.max_score:g}{manual}{flag}{note}")
