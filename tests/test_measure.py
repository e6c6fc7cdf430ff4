"""bookutils.measure.best_times: the calls take turns, and each timed call follows
an untimed run of itself, so that no call is timed in the state its predecessor
(a larger call) left the caches and the allocator in."""
from bookutils import measure


def test_each_timed_call_follows_an_untimed_run_of_itself(monkeypatch):
    events, ticks = [], iter(range(100))

    def clock():
        events.append("clock")
        return next(ticks)

    monkeypatch.setattr(measure.time, "perf_counter", clock)
    best = measure.best_times([lambda: events.append("a"), lambda: events.append("b")], rounds=2)
    one_round = ["a", "clock", "a", "clock", "b", "clock", "b", "clock"]
    assert events == one_round * 2
    assert list(best) == [1, 1]     # each timed call spans one tick of the fake clock


def test_the_fastest_round_is_kept(monkeypatch):
    ticks = iter([0, 5, 10, 12])   # round 1 takes 5 ticks, round 2 takes 2
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(ticks))
    assert list(measure.best_times([lambda: None], rounds=2)) == [2]
