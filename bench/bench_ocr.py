"""OCR cost and quality: time per picture (gate only, and full), word recall, gate misses.

On the generated gallery of tests/ocr_gallery.py (signs, receipts and screens in Debian's fonts,
turned 0/90/180/270° and tilted up to ±20°, in perspective, JPEG 60-90; plus text-free
landscapes), with the PP-OCRv4 models of the installed rapidocr-onnxruntime wheel under the
default backend:

- time per picture at 1024x768 and at 12 MP (4000x3000), decode included, median of --rounds:
  the gate alone (``has_text``) and the whole read (``read_text`` with the gate off);
- recall of the words of at least 4 letters, by kind and by rotation;
- the gate's false-negative rate (text scenes it would skip) and how many landscapes it lets
  through (each costs a full detection).

Run: .venv/bin/python bench/bench_ocr.py [--count 48] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from tests.ocr_gallery import build_gallery, fonts, make_scene, words_found
from themis_clip.config import OCRConfig
from themis_clip.ocr import OCREngine


def timed(fn, rounds: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=48, help="text scenes (landscapes: a third)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    engine = OCREngine.load(OCRConfig(enabled=True))
    full = OCREngine.load(replace(engine.config, gate=False))
    print(f"models: {engine.label} on {engine.stats()['provider']}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("\n| picture | gate only, ms | full read, ms | lines |")
        print("|---|---:|---:|---:|")
        for size, label in (((1024, 768), "1024x768"), ((4000, 3000), "4000x3000 (12 MP)")):
            for kind in ("sign", "receipt", "landscape"):
                path = folder / f"time-{kind}-{size[0]}.jpg"
                make_scene(path, kind=kind, font=fonts()[0], seed=7, size=size)
                gate_ms = timed(lambda p=path: engine.has_text(p), args.rounds)
                read_ms = timed(lambda p=path: full.read_text(p), args.rounds)
                lines = len(full.read_text(path).lines)
                print(f"| {label} {kind} | {gate_ms:.0f} | {read_ms:.0f} | {lines} |")

        scenes = build_gallery(folder / "gallery", count=args.count)
        by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        by_turn: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        gate_missed = gate_passed_empty = landscapes = with_text = 0
        misses = []
        for scene in scenes:
            passed = engine.has_text(scene.path)
            if scene.kind == "landscape":
                landscapes += 1
                gate_passed_empty += passed
                continue
            with_text += 1
            gate_missed += not passed
            result = full.read_text(scene.path)
            found, total = words_found(scene.words, result.text)
            for acc in (by_kind[scene.kind], by_turn[scene.rotation]):
                acc[0] += found
                acc[1] += total
            if found < total:
                misses.append(f"{scene.path.name}: read {result.text!r}, shown {scene.words}")
        found = sum(v[0] for v in by_kind.values())
        total = sum(v[1] for v in by_kind.values())
        print(f"\nword recall (>= 4 letters): {found}/{total} = {found / total:.3f}")
        for kind, (f, t) in sorted(by_kind.items()):
            print(f"  {kind}: {f}/{t} = {f / t:.3f}")
        for turn, (f, t) in sorted(by_turn.items()):
            print(f"  rotated {turn}: {f}/{t} = {f / t:.3f}")
        print(
            f"gate false negatives: {gate_missed}/{with_text} = {gate_missed / with_text:.3f}; "
            f"landscapes let through: {gate_passed_empty}/{landscapes}"
        )
        for line in misses[:12]:
            print("  miss:", line)


if __name__ == "__main__":
    main()
