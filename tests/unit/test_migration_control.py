"""MigrationControl: the duty cycle rests after each chunk in proportion to its time, and a
cancel or pause ends a rest at once."""

from __future__ import annotations

import threading
import time

import pytest

from themis_clip.errors import ConfigError
from themis_clip.migration import MigrationControl


def test_a_duty_of_a_quarter_rests_three_times_the_chunk() -> None:
    control = MigrationControl("m", duty=0.25)  # a run begins as it is made
    time.sleep(0.05)  # the chunk's work
    t0 = time.monotonic()
    assert control.checkpoint(10, 100, 10)
    assert time.monotonic() - t0 >= 0.14
    snap = control.snapshot()
    assert snap.done == 10 and snap.total == 100
    assert 0 < snap.items_per_s <= 10 / 0.19  # the rest counts in the rate and the ETA


def test_a_cancel_ends_a_rest_at_once() -> None:
    control = MigrationControl("m", duty=0.001)
    time.sleep(0.02)  # the chunk's work: a 20 s rest follows
    out: list[bool] = []
    worker = threading.Thread(target=lambda: out.append(control.checkpoint(1, 2, 1)))
    t0 = time.monotonic()
    worker.start()
    while control.snapshot().done != 1:  # it is resting
        assert time.monotonic() - t0 < 5
        time.sleep(0.001)
    control.cancel()
    worker.join(5)
    assert out == [False] and time.monotonic() - t0 < 5


def test_a_duty_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="duty"):
        MigrationControl("m", duty=0)
