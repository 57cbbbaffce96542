"""Progress lines: elapsed time and the estimate of the time left, from the weight done so far."""

from __future__ import annotations

from zmlx_pipeline.progress import Steps, clock_text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_clock_text():
    assert clock_text(0) == "0:00" and clock_text(59.6) == "1:00" and clock_text(125) == "2:05"
    assert clock_text(3725) == "1:02:05" and clock_text(-3) == "0:00"


def test_estimate_scales_the_elapsed_time_by_the_weight_left():
    lines: list[str] = []
    clock = Clock()
    steps = Steps(lines.append, "report", total=10.0, parts=3, clock=clock)
    steps.note("3 folds to score")
    clock.now += 20
    steps.done("big fold scored", 4.0)      # 4 of 10 in 20 s: 6 more take 30 s
    clock.now += 10
    steps.done("small fold scored", 1.0)    # 5 of 10 in 30 s: 5 more take 30 s
    clock.now += 15
    steps.done("last fold scored", 5.0)
    assert lines == [
        "report: 3 folds to score, 0:00 elapsed",
        "report: big fold scored (1/3), 0:20 elapsed, about 0:30 left",
        "report: small fold scored (2/3), 0:30 elapsed, about 0:30 left",
        "report: last fold scored (3/3), 0:45 elapsed, done",
    ]
    assert steps.remaining() == 0.0


def test_no_estimate_before_any_weight_and_silence_without_a_callback():
    lines: list[str] = []
    clock = Clock()
    steps = Steps(lines.append, "publish", total=2.0, clock=clock)
    assert steps.remaining() is None
    clock.now += 5
    steps.done("a kernel with no weight", 0.0)
    assert lines == ["publish: a kernel with no weight, 0:05 elapsed, estimating the time left"]
    quiet = Steps(None, "publish", total=1.0, clock=clock)
    quiet.done("x")
    quiet.note("y")
    assert quiet.count == 1 and quiet.weight == 1.0


def test_a_later_phase_says_the_commands_elapsed_time_and_estimates_from_its_own_pace():
    lines: list[str] = []
    clock = Clock()
    began = clock.now
    clock.now += 60                      # an earlier phase took a minute
    steps = Steps(lines.append, "publish", total=2.0, parts=2, clock=clock, started=began)
    clock.now += 10
    steps.done("first kernel built")     # 1 of 2 in this phase's 10 s: 10 s left
    assert lines == ["publish: first kernel built (1/2), 1:10 elapsed, about 0:10 left"]
