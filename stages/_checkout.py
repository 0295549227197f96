"""Run the ``hbnn`` code of the checkout this script lives in, whatever ``hbnn`` is installed.

``make`` installs the package in editable mode, which puts *one* checkout's ``src/`` on
every interpreter's path. ``dvc exp run --queue`` runs each experiment in its own
temporary copy of the repository: without this, its stages would import the code of
the main checkout (including edits made while the queue runs) instead of the code of
the commit the experiment records. Imported first by every script in ``stages/``.
"""

import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
if sys.path[:1] != [SRC]:
    sys.path.insert(0, SRC)
