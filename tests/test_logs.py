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
