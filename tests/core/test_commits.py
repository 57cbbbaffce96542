"""core/commits.py: a stop waits only inside the CLI's final step, from its commit point on."""

from __future__ import annotations

import pytest

from zmlx_pipeline.core import commits


@pytest.fixture(autouse=True)
def fresh():
    commits.reset()
    yield
    commits.reset()


def test_outside_a_final_step_a_commit_point_changes_nothing():
    with commits.commit_point():
        assert not commits.stop_waits(2)
    assert not commits.is_final() and commits.waited_stops() == []


def test_a_stop_waits_during_and_after_the_commit_point_of_a_final_step():
    with commits.final():
        assert not commits.stop_waits(2)  # before the commit: the stop stops the command
        with commits.commit_point():
            assert commits.stop_waits(15)  # during it: waits for its outcome
        assert commits.is_final() and commits.stop_waits(2)  # after it: the command finishes
    assert commits.is_final() and commits.waited_stops() == [15, 2]


def test_a_failed_commit_point_or_final_step_leaves_the_work_not_final():
    with pytest.raises(OSError), commits.final():
        with commits.commit_point():
            raise OSError("disk full")
    assert not commits.is_final() and not commits.stop_waits(2)


def test_a_final_step_that_returns_makes_the_work_final_without_a_commit_point():
    with commits.final():
        pass
    assert commits.is_final() and commits.stop_waits(2)
    commits.reset()
    assert not commits.is_final() and commits.waited_stops() == []
