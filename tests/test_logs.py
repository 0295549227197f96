import logging
import time

from hbnn.logs import heartbeat


def test_heartbeat_speaks_during_a_long_block_and_not_after(caplog):
    logger = logging.getLogger("hbnn.test_heartbeat")
    with caplog.at_level(logging.INFO, logger="hbnn.test_heartbeat"):
        with heartbeat(logger, "sampling: backend=x", every=0.05):
            time.sleep(0.3)
        n = len(caplog.records)
        time.sleep(0.15)
    assert n >= 3
    assert len(caplog.records) == n  # the thread stopped with the block
    assert caplog.records[0].getMessage().startswith("sampling: backend=x: still running, ")


def test_heartbeat_is_silent_for_a_short_block(caplog):
    logger = logging.getLogger("hbnn.test_heartbeat")
    with caplog.at_level(logging.INFO, logger="hbnn.test_heartbeat"):
        with heartbeat(logger, "quick", every=10.0):
            pass
    assert not caplog.records


def test_heartbeat_adds_the_status_it_is_given(caplog):
    logger = logging.getLogger("hbnn.test_heartbeat")
    with caplog.at_level(logging.INFO, logger="hbnn.test_heartbeat"):
        with heartbeat(logger, "fit_flat", every=0.05, status=lambda s: f"status after {s > 0}"):
            time.sleep(0.13)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(line.startswith("fit_flat: still running, ") and line.endswith("; status after True")
                         for line in lines)


def test_group_progress_counts_groups_draws_divergences_and_time_left():
    from hbnn.fitting.per_group import GroupProgress

    p = GroupProgress(n_groups=4, draws_per_group=100)
    assert p.status(3.0) == "0/4 groups, 0/400 draws, 0 divergences so far"
    p.done(2.0, 1)
    p.done(2.0, 2)
    assert p.status(4.0) == "2/4 groups, 200/400 draws, 3 divergences so far, ~4s left"
    assert p.summary() == "2/4 groups, 200/400 draws, 3 divergences so far, 4.0s sampling"
