"""Logging for the stages and the ``hbnn`` command: hbnn's own lines at INFO, libraries' at WARNING.

``HBNN_LOG=debug`` adds detail (each fit's seed, the compile cache's decisions);
``HBNN_LOG=warning`` keeps only warnings and errors. Lines go to standard error.
"""

from __future__ import annotations

import logging
import os

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure() -> None:
    """Third-party libraries at WARNING; ``hbnn`` at ``HBNN_LOG`` (default ``info``; unknown values too)."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT)
    level = LEVELS.get(os.environ.get("HBNN_LOG", "info").strip().lower(), logging.INFO)
    logging.getLogger("hbnn").setLevel(level)
