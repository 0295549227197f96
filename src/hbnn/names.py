"""What a name may be: a group, feature, label or split column is named by printable text of limited length."""

from __future__ import annotations

# A column's or group's name is shown in table cells, figure titles, legends and error lines: 100 characters holds any
# identifier or label a person types, and a longer one would crowd those out (or be a whole text pasted by mistake)
MAX_NAME_LENGTH = 100


def name_problem(name: str) -> str | None:
    """What makes ``name`` unfit to name a column or a group, as words that follow "the name", or ``None``.

    A name must be printable text (``str.isprintable``: no NUL, newline, tab or other control or format character, which
    files cut at, tables break on or terminals act on), not empty or only spaces, and at most :data:`MAX_NAME_LENGTH`
    characters. Names are shown in tables, figures and error lines; what would mark them up there is escaped where they
    are written (:mod:`hbnn.report.document`, :mod:`hbnn.report.plots`), not refused here.

    Parameters
    ----------
    name : str

    Returns
    -------
    str or None
        The problem (``"is empty"``, ...), ``None`` for a usable name.
    """
    if not name.strip():
        return "is empty" if not name else "is only spaces"
    bad = next((c for c in name if not c.isprintable()), None)
    if bad is not None:
        return (f"holds the non-printable character U+{ord(bad):04X} ({bad!r}) at character {name.index(bad) + 1}; "
                "names must be printable text")
    if len(name) > MAX_NAME_LENGTH:
        return f"is {len(name)} characters long; names may have at most {MAX_NAME_LENGTH}"
    return None
