"""One ``dvc repro`` (or ``dvc exp run``) runs all its stages with one set of params.

DVC reads ``params.yaml`` as each stage starts, and its lock does not stop a second ``dvc exp run`` in the same
workspace from writing its ``-S`` values into the file before refusing to run: the first run's later stages would
then use the second's values. The stage runner (:func:`hbnn.pipeline.runner.run_stage`) therefore notes, in
``.dvc/tmp``, the params the first of a DVC process's stages read (:func:`same_params_as_this_run`), and every later
stage of that process compares: a stage that finds other values stops with one error line, writing nothing.

The DVC process is the stage's nearest ancestor process running ``dvc``, found in ``/proc`` (Linux); elsewhere, or
for a stage run by hand, nothing is noted or compared. What stays open: a second command that writes its values
before the first command's first stage has read the file (within a second or so of each other) goes unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from hbnn.config import Params
from hbnn.config_read import params_differences
from hbnn.errors import ChangedMeanwhile

log = logging.getLogger(__name__)

NOTES = Path(".dvc") / "tmp"  # DVC's own scratch folder, beside its locks, relative to the stage's folder


def _stat(pid: int) -> tuple[int, str] | None:
    """A process's parent and start time (fields 4 and 22 of ``/proc/<pid>/stat``), ``None`` where unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # past the command name, which may hold spaces
    return int(fields[1]), fields[19]


def _is_dvc(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [os.path.basename(a.decode(errors="replace")) for a in argv[:3]]
    return words[:1] == ["dvc"] or (len(words) >= 3 and words[1:3] == ["-m", "dvc"]) or (
        len(words) >= 2 and words[1] == "dvc")


def dvc_process() -> str | None:
    """``<pid>-<start time>`` of the DVC process this stage runs under, ``None`` where there is none to be found."""
    pid = os.getppid()
    for _ in range(8):  # dvc -> (a shell) -> the stage's python
        if pid <= 1:
            return None
        if _is_dvc(pid):
            found = _stat(pid)
            return f"{pid}-{found[1]}" if found else None
        found = _stat(pid)
        if found is None:
            return None
        pid = found[0]
    return None


def _fingerprint(params: Params) -> str:
    return hashlib.sha256(json.dumps(params.to_dict(), sort_keys=True).encode()).hexdigest()


def same_params_as_this_run(params: Params, folder: Path = NOTES) -> None:
    """Note ``params`` as this DVC process's, or refuse them where an earlier stage of it read other values.

    See the module. Notes of DVC processes that have ended are removed; outside a DVC process nothing happens.

    Parameters
    ----------
    params : hbnn.config.Params
        The params this stage read.
    folder : pathlib.Path, optional
        Where the notes are kept (:data:`NOTES`).

    Raises
    ------
    hbnn.errors.ChangedMeanwhile
        If an earlier stage of this DVC process read other params.
    """
    run = dvc_process()
    if run is None or not folder.parent.is_dir():
        return
    note = folder / f"hbnn-params-{run}.json"
    try:
        earlier = json.loads(note.read_text())
    except (OSError, ValueError):
        earlier = None
    if isinstance(earlier, dict) and "fingerprint" in earlier:
        if earlier["fingerprint"] != _fingerprint(params):
            changed = params_differences(earlier.get("params", {}), params.to_dict())
            shown = ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")
            raise ChangedMeanwhile(f"params.yaml changed between the stages of this dvc run ({shown}): its earlier "
                                   "stages used the earlier values, so this stage wrote nothing. Another `dvc exp run` "
                                   "in this workspace, or an edit? Check the file and run again")
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("hbnn-params-*.json"):
            pid = old.stem.removeprefix("hbnn-params-").split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                old.unlink(missing_ok=True)
        tmp = note.with_name(f".{note.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"fingerprint": _fingerprint(params), "params": params.to_dict()}))
        os.replace(tmp, note)
    except OSError as err:  # a read-only workspace: nothing to compare with later, nothing else changes
        log.debug("cannot note this run's params in %s (%s)", folder, err)
