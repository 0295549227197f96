"""Rewrite the README's and the docs' images in ``docs/_static`` from a finished run: ``python docs/make_images.py``.

- ``status_box.png``: the status section of ``reports/report.html`` (with the report's own styles), rendered by
  headless Chromium (``chromium-headless-shell`` or ``chromium``) and cropped to the box;
- ``surfaces_hierarchical.png``: ``reports/figures/surface_hierarchical_p01.png``, scaled down and reduced to a
  palette so that the repository stays small.

Run it after ``make repro``; it reads the report and writes only those two files.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageChops

HERE = Path(__file__).resolve().parent / "_static"
ROOT = HERE.parents[1]
WIDTH = 1000  # CSS pixels of the status box's page; the README shows it at this width or less


def status_box(report: Path, out: Path) -> None:
    """Render the report's status section alone and crop the screenshot to it."""
    html = report.read_text(encoding="utf-8")
    style = re.search(r"<style>.*?</style>", html, re.S).group(0)
    section = re.search(r'<section id="status".*?</section>', html, re.S).group(0)
    body = "<body style='margin:0;padding:8px;max-width:none'>"
    page = f"<!doctype html><html><head><meta charset='utf-8'>{style}</head>{body}{section}</body></html>"
    browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if browser is None:
        sys.exit("error: needs chromium-headless-shell or chromium on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        src, shot = Path(tmp, "status.html"), Path(tmp, "shot.png")
        src.write_text(page, encoding="utf-8")
        subprocess.run([browser, "--headless", "--no-sandbox", "--hide-scrollbars", f"--window-size={WIDTH},1400",
                        f"--screenshot={shot}", src.as_uri()], check=True, capture_output=True)
        image = Image.open(shot).convert("RGB")
    background = Image.new("RGB", image.size, (255, 255, 255))
    box = ImageChops.difference(image, background).getbbox()
    image.crop((0, 0, image.width, box[3] + 8)).quantize(64).save(out, optimize=True)


def figure(src: Path, out: Path, width: int = 1000) -> None:
    """A report figure scaled to ``width`` pixels and reduced to a palette."""
    image = Image.open(src).convert("RGB")
    image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    image.quantize(128).save(out, optimize=True)


if __name__ == "__main__":
    status_box(ROOT / "reports" / "report.html", HERE / "status_box.png")
    figure(ROOT / "reports" / "figures" / "surface_hierarchical_p01.png", HERE / "surfaces_hierarchical.png")
