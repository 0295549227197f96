"""Write the example tables in ``data/examples/`` (deterministic; rerun to regenerate).

``sites.csv``: 12 sites with 8 to 300 rows each. Every site is a two-moons
problem (``make_moons``, noise 0.3, standardised) rotated by its own angle
``N(0, 1) * 45`` degrees, so sites are related but not equal, as in the moons
pipeline but with unequal sizes. The two moon coordinates are reported in
physical-looking units (``temperature``, ``pressure``); ``humidity`` is pure
noise, a feature the models have to learn to ignore. ``failed`` is the moon label.

``new_sites.csv``: unlabelled rows to score with ``hbnn predict``: a few from
two known sites (S03, S12) and from a site the models never saw (S13).

Usage: ``python scripts/make_example_table.py [--out-dir data/examples]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.datasets import make_moons
from sklearn.preprocessing import scale

SEED = 2024
SIZES = (8, 10, 14, 20, 28, 40, 56, 80, 110, 150, 210, 300)
NEW = {"S03": 4, "S12": 4, "S13": 6}  # rows to score per site; S13 is unseen


def site_rows(rng: np.random.Generator, n: int, angle_deg: float) -> tuple[np.ndarray, np.ndarray]:
    """``(n, 3)`` raw features and ``(n,)`` 0/1 labels of one site."""
    x, y = make_moons(n_samples=n, noise=0.3, random_state=int(rng.integers(2**31)))
    theta = np.radians(angle_deg)
    c, s = np.cos(theta), np.sin(theta)
    x = scale(x) @ np.array([[c, -s], [s, c]])
    temperature = 60.0 + 8.0 * x[:, 0]
    pressure = 3.0 + 0.4 * x[:, 1]
    humidity = 40.0 + 10.0 * rng.standard_normal(n)
    return np.column_stack([temperature, pressure, humidity]), y


def frame(site: str, X: np.ndarray, y: np.ndarray | None) -> pd.DataFrame:
    df = pd.DataFrame({"site": site, "temperature": X[:, 0].round(2), "pressure": X[:, 1].round(3),
                       "humidity": X[:, 2].round(1)})
    if y is not None:
        df["failed"] = y
    return df


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("data/examples"))
    args = parser.parse_args(argv)
    rng = np.random.default_rng(SEED)
    names = [f"S{i + 1:02d}" for i in range(len(SIZES) + 1)]
    angles = dict(zip(names, rng.standard_normal(len(names)) * 45.0, strict=True))
    parts = [frame(name, *site_rows(rng, n, angles[name])) for name, n in zip(names, SIZES, strict=False)]
    new = []
    for name, n in NEW.items():
        X, _ = site_rows(rng, max(n, 2), angles[name])
        new.append(frame(name, X[:n], None))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    pd.concat(parts, ignore_index=True).to_csv(args.out_dir / "sites.csv", index=False)
    pd.concat(new, ignore_index=True).to_csv(args.out_dir / "new_sites.csv", index=False)


if __name__ == "__main__":
    main()
