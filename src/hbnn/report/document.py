"""The report as a document: paragraphs, tables, figures and sections, rendered to Markdown and HTML."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

CSS = """
body { font-family: sans-serif; max-width: 1150px; margin: 0 auto; padding: 1em 2em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 2px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
img { max-width: 100%; height: auto; display: block; margin: 0.4em 0; }
figure { margin: 0.8em 0; } figcaption { font-size: 0.85em; color: #555; }
.how { color: #444; background: #f6f6f6; padding: 0.4em 0.8em; border-left: 3px solid #999; }
.warn { color: #8a1c00; font-weight: bold; }
section.status { border: 2px solid #2e7d32; background: #f1f8f1; padding: 0 1em 0.6em; margin-top: 1em; }
section.status.fail { border-color: #b71c1c; background: #fdecea; }
section.status h2 { margin-top: 0.6em; border-bottom: none; }
nav.toc { font-size: 0.95em; } nav.toc ol { margin: 0.3em 0; }
"""

# Characters Markdown (CommonMark, GitHub's with its tables and $ maths) may read as markup or raw HTML anywhere in a
# line: each is written after a backslash, which CommonMark allows before any ASCII punctuation
_MARKDOWN_INLINE = re.compile(r"([\\`*_\[\]<>#|~&$])")
# What starts a list or underlines a heading where a paragraph begins: "-", "+", "=", or the "." or ")" of "1."
_MARKDOWN_BLOCK_START = re.compile(r"^(?:[-+=]|\d+[.)])")


def markdown_text(text: str, block: bool = False) -> str:
    """``text`` (plain text: a group's or feature's name as the user wrote it, or the report's own words) as
    Markdown that shows it literally: every character Markdown could read as emphasis, code, a link, a heading, a
    table's cell border, an HTML tag or entity, or maths is escaped with a backslash, and line breaks become spaces
    (a table row is one line). ``block``: the text begins a paragraph, where leading spaces would make it code and a
    leading ``-``, ``+``, ``=`` or ``1.`` a list or a heading's underline: the spaces are dropped (Markdown shows
    none) and the marker escaped.

    Every text :func:`render_markdown` writes goes through here, as :func:`render_html` puts every text through
    ``html.escape``: the document holds plain text, and each renderer escapes it for its format.

    Parameters
    ----------
    text : str
        Plain text.
    block : bool, default False
        Whether the text begins a paragraph.

    Returns
    -------
    str
        Markdown.
    """
    text = _MARKDOWN_INLINE.sub(r"\\\1", " ".join(str(text).splitlines()))
    if block:
        text = text.lstrip()
        if _MARKDOWN_BLOCK_START.match(text):
            cut = len(text) - len(text.lstrip("0123456789")) if text[0].isdigit() else 0
            text = f"{text[:cut]}\\{text[cut:]}"
    return text


@dataclass(frozen=True)
class Para:
    """A paragraph of plain text; ``warn`` draws it as a warning (bold, red in HTML)."""

    text: str
    warn: bool = False


@dataclass(frozen=True)
class Heading:
    """A sub-heading within a section."""

    text: str


@dataclass(frozen=True)
class Table:
    """A table of plain-text cells: a header and rows; numbers are right-aligned."""

    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    text_columns: Sequence[int] = ()  # columns of prose, left-aligned (the first always is; the rest: numbers)


@dataclass(frozen=True)
class Figure:
    """An embedded figure: its file name under ``figures/`` and its caption."""

    name: str  # file name under figures/
    caption: str


@dataclass(frozen=True)
class FigureLinks:
    """Figures kept as files beside the report (``figures/<name>``) and linked, not embedded."""

    text: str  # what they are, before the links
    names: Sequence[str]  # file names under figures/
    labels: Sequence[str]  # link texts


@dataclass(frozen=True)
class Section:
    """A section of the report: title, a "how to read this" note, its blocks, its HTML id and, for a status
    section, whether something fails."""

    title: str
    how_to_read: str
    blocks: Sequence[Para | Heading | Table | Figure | FigureLinks]
    anchor: str = ""  # the HTML id; empty: made from the title
    failing: bool | None = None  # a status section: True when something fails (drawn red), False when all is well


def anchors(sections: Sequence[Section]) -> list[str]:
    """One unique HTML id per section.

    Parameters
    ----------
    sections : sequence of Section

    Returns
    -------
    list of str
        Each section's ``anchor``, else its title in lower case with runs of other characters as ``-``; a repeated
        id gets ``-2``, ``-3``, ...
    """
    out: list[str] = []
    for sec in sections:
        base = sec.anchor or "".join(c if c.isalnum() else "-" for c in sec.title.lower()).strip("-")
        base = "-".join(filter(None, base.split("-"))) or "section"
        name, i = base, 2
        while name in out:
            name, i = f"{base}-{i}", i + 1
        out.append(name)
    return out


def _png_width_px(data: bytes) -> int:
    """Width of a PNG from its IHDR chunk."""
    return int.from_bytes(data[16:20], "big")


def render_markdown(title: str, intro: Sequence[Para], sections: Sequence[Section]) -> str:
    """The report as Markdown; figures are linked as ``figures/<name>``.

    Every text is escaped (:func:`markdown_text`), so names show as written and nothing in them becomes markup.

    Parameters
    ----------
    title : str
        The report's title.
    intro : sequence of Para
        The paragraphs before the first section.
    sections : sequence of Section
        The sections, the status section first.

    Returns
    -------
    str
    """
    m = markdown_text

    def para(p: Para) -> str:
        return f"**{m(p.text)}**" if p.warn else m(p.text, block=True)

    out = [f"# {m(title)}", ""]
    for p in intro:
        out += [para(p), ""]
    ids = anchors(sections)
    for k, sec in enumerate(sections):
        if k == 1:  # the contents follow the status section
            out += ["## Contents", ""] + [f"{i}. [{m(s.title)}](#{a})" for i, (s, a) in
                                          enumerate(zip(sections, ids, strict=True), start=1)] + [""]
        out += [f'<a id="{ids[k]}"></a>', "", f"## {m(sec.title)}", "", f"*How to read this:* {m(sec.how_to_read)}",
                ""]
        for b in sec.blocks:
            if isinstance(b, Heading):
                out += [f"### {m(b.text)}", ""]
            elif isinstance(b, Para):
                out += [para(b), ""]
            elif isinstance(b, FigureLinks):
                links = ", ".join(f"[{m(label)}](figures/{n})" for n, label in zip(b.names, b.labels, strict=True))
                out += [f"{m(b.text, block=True)} {links}", ""]
            elif isinstance(b, Table):
                out.append("| " + " | ".join(m(h) for h in b.header) + " |")
                out.append("|" + "|".join("---" if i == 0 or i in b.text_columns else "---:"
                                          for i in range(len(b.header))) + "|")
                out += ["| " + " | ".join(m(c) for c in row) + " |" for row in b.rows]
                out.append("")
            else:
                out += [f"![{m(b.caption)}](figures/{b.name})", "", f"*{m(b.caption)}*", ""]
    return "\n".join(out)


def render_html(title: str, intro: Sequence[Para], sections: Sequence[Section], figures: dict[str, bytes],
                dpi: float = 150.0) -> str:
    """The report as one offline HTML page: inline CSS, images as base64 data URIs.

    Each section is a ``<section id=...>``; a table of contents follows the
    first (the status) section. Images are shown at one figure inch per CSS
    inch (``dpi`` pixels per inch in the PNG), shrunk only where the page is
    narrower, so the figures' point sizes are the sizes a reader sees.

    Parameters
    ----------
    title : str
        The report's title.
    intro : sequence of Para
        The paragraphs before the first section.
    sections : sequence of Section
        The sections, the status section first.
    figures : dict of str to bytes
        Every embedded figure's PNG, by file name.
    dpi : float, default 150.0
        The PNGs' pixels per figure inch.

    Returns
    -------
    str
    """
    e = html.escape

    def para(p: Para) -> str:
        return f'<p class="warn">{e(p.text)}</p>' if p.warn else f"<p>{e(p.text)}</p>"

    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{e(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>", f"<h1>{e(title)}</h1>"]
    out += [para(p) for p in intro]
    ids = anchors(sections)
    for k, sec in enumerate(sections):
        if k:
            out.append("</section>")
        if k == 1:
            out += ['<nav class="toc"><h2>Contents</h2><ol>']
            out += [f'<li><a href="#{a}">{e(s.title)}</a></li>' for s, a in zip(sections, ids, strict=True)]
            out += ["</ol></nav>"]
        cls = "" if sec.failing is None else f' class="status{" fail" if sec.failing else ""}"'
        out += [f'<section id="{ids[k]}"{cls}>', f"<h2>{e(sec.title)}</h2>",
                f'<p class="how"><b>How to read this:</b> {e(sec.how_to_read)}</p>']
        for b in sec.blocks:
            if isinstance(b, Heading):
                out.append(f"<h3>{e(b.text)}</h3>")
            elif isinstance(b, Para):
                out.append(para(b))
            elif isinstance(b, FigureLinks):
                links = ", ".join(f'<a href="figures/{e(n)}">{e(label)}</a>'
                                  for n, label in zip(b.names, b.labels, strict=True))
                out.append(f"<p>{e(b.text)} {links}</p>")
            elif isinstance(b, Table):
                left = ' style="text-align: left"'
                out.append("<table><thead><tr>" + "".join(f"<th{left if i in b.text_columns else ''}>{e(h)}</th>"
                                                          for i, h in enumerate(b.header)) + "</tr></thead>")
                out.append("<tbody>")
                out += ["<tr>" + "".join(f"<td{left if i in b.text_columns else ''}>{e(c)}</td>"
                                         for i, c in enumerate(row)) + "</tr>" for row in b.rows]
                out.append("</tbody></table>")
            else:
                png = figures[b.name]
                data = base64.b64encode(png).decode("ascii")
                width = round(_png_width_px(png) * 96 / dpi)
                out.append(f'<figure><img src="data:image/png;base64,{data}" style="width: {width}px" '
                           f'alt="{e(b.caption)}"><figcaption>{e(b.caption)}</figcaption></figure>')
    if sections:
        out.append("</section>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)
