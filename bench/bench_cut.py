"""Precision and recall of the relevance cut on a labelled gallery of the demo model's world.

A gallery of generated scenes (the file names carry the truth), every "a COLOUR SHAPE" query
(some with no right answer in the gallery), and for each query the first ``--k`` hits under
``cut=none`` (the ranking as it was), ``cut=auto`` and flat score thresholds. Precision: the
share of returned hits that are right; recall: the share of right scenes returned (of those
within the first k). Queries with no right answer count how many hits they still return.

    .venv/bin/python bench/bench_cut.py --count 300 --k 30
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from themis_clip import ModelConfig, PluginConfig, demo_model_path
from themis_clip.collection import Collection
from themis_clip.demo.queries import DemoQuery
from themis_clip.demo.scenes import COLOURS, SHAPES, write_gallery


class Outside:
    """A query about something the demo world does not hold: every hit is wrong."""

    def __init__(self, text: str) -> None:
        self.text = text

    def matches(self, scene: object) -> bool:
        return False


OUTSIDE = [
    Outside(t)
    for t in (
        "a dog on a beach",
        "a birthday cake with candles",
        "a snowy mountain at sunset",
        "a receipt from a coffee shop",
        "two people holding hands",
        "a red car parked on the street",
    )
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--k", type=int, default=30)
    args = ap.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(next((line for line in cpu.splitlines() if line.startswith("Model name")), "cpu ?"))
    with tempfile.TemporaryDirectory() as tmp:
        gallery = write_gallery(Path(tmp) / "g", args.count, seed=7)
        truth = {str(p.resolve()): s for p, s in gallery}
        config = PluginConfig(model=ModelConfig(path=str(demo_model_path())))
        with Collection.open(Path(tmp) / "i.db", config) as photos:
            photos.index_folder(Path(tmp) / "g")
            line = photos.line()
            print(f"gallery {args.count}, k {args.k}; line {line.score:.3f} ({line.describe()})")
            queries = [DemoQuery(colour=c, shape=s) for c, s in itertools.product(COLOURS, SHAPES)]
            rows: dict[str, list[tuple[float, float, int]]] = {}
            empty: dict[str, list[int]] = {}
            for q in [*queries, *OUTSIDE]:  # type: ignore[list-item]
                right = sum(q.matches(s) for s in truth.values())
                for label, cut in (
                    ("none", "none"),
                    ("auto", "auto"),
                    *[(f"flat {t}", str(t)) for t in (0.6, 0.7, 0.8)],
                ):
                    hits = photos.search(q.text, k=args.k, cut=cut)
                    good = sum(q.matches(truth[h.path or ""]) for h in hits)
                    if right == 0:
                        empty.setdefault(label, []).append(len(hits))
                        continue
                    reachable = min(right, args.k)
                    precision = good / len(hits) if hits else 1.0
                    rows.setdefault(label, []).append((precision, good / reachable, len(hits)))
    print(f"{len(queries) + len(OUTSIDE)} queries, {len(OUTSIDE)} about nothing in the gallery")
    print("| cut | precision | recall | hits per query | hits for queries with no answer |")
    print("|---|---:|---:|---:|---:|")
    for label, values in rows.items():
        arr = np.asarray(values)
        none_hits = np.mean(empty.get(label, [0]))
        print(
            f"| {label} | {arr[:, 0].mean():.3f} | {arr[:, 1].mean():.3f} | "
            f"{arr[:, 2].mean():.1f} | {none_hits:.1f} |"
        )


if __name__ == "__main__":
    main()
