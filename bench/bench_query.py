"""The query path at 100k items (issue 44 item 4): a text query's latency, end to end.

Builds an SQLite index of ``--items`` embedding-like vectors (``bench/embedding_data.py``: clustered,
TwoNN ~28) stamped with the model's identity, with a path and EXIF-like metadata per item, and its
search graph (``prepare_graph``, as ``themis-clip index`` does). Then, per backend (AUTO, which
is OpenVINO bf16 on a CPU with bf16, and ONNX Runtime's CPU in fp32), one client at a time:

- ``text``: the text tower alone at batch 1 (``generate_text_embedding``);
- ``in-process``: text in, hits with their rows out (the embedding, ``VectorIndex.search``);
- ``http``: ``POST /search {"text": ..., "k": 10}`` to ``themis-clip serve`` on that index
  (httpx, one kept-alive connection; JSON answer parsed), the way a page or a script asks, with
  the server's defaults (the relevance cut included: it may return fewer than 10).

Every query is a different caption (no cache can answer it). Prints the CPU's model line and
flags, the provider each backend got, p50/p95 per path, and the AUTO ÷ CPU ratios.

Run: PYTHONPATH=src:bench .venv/bin/python bench/bench_query.py [--items 100000] [--queries 200]
     [--model bench/models/hf-vit-b-32]   (make_models.py hf-vit-b-32 builds the model)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_openvino import cpu_lines
from embedding_data import clustered_rows
from serving import serve

from themis_clip import OnnxClipPlugin, PluginConfig
from themis_clip.index.search import VectorIndex
from themis_clip.index.stores import ItemRow

HERE = Path(__file__).resolve().parent
SUBJECTS = ["dog", "cat", "beach", "mountain", "birthday cake", "bicycle", "old town", "forest"]
PLACES = ["at night", "in the snow", "with friends", "from above", "in the rain", "at sunset"]


def captions(n: int) -> list[str]:
    return [f"a photo of a {SUBJECTS[i % 8]} {PLACES[i // 8 % 6]} number {i}" for i in range(n)]


def quantiles(ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p95_ms": round(float(np.percentile(ms, 95)), 2),
    }


def build(location: Path, plugin: OnnxClipPlugin, n: int) -> dict[str, float]:
    identity = plugin.model_identity
    assert identity is not None
    rng = np.random.default_rng(0)
    vectors = clustered_rows(rng, n, identity.dim)
    t0 = time.perf_counter()
    with VectorIndex(location) as index:
        index.bind_model(identity)
        for s in range(0, n, 5000):
            rows = [
                ItemRow(
                    key=f"photos/{i // 1000:03d}/IMG_{i:06d}.jpg",
                    vector=vectors[i],
                    path=f"/photos/{i // 1000:03d}/IMG_{i:06d}.jpg",
                    metadata={"taken": f"20{20 + i % 5}-0{1 + i % 9}-1{i % 10}", "album": "all"},
                )
                for i in range(s, min(n, s + 5000))
            ]
            index.store.upsert(rows, dim=identity.dim)
        loaded = time.perf_counter() - t0
        t1 = time.perf_counter()
        index.prepare_graph()
        graph = time.perf_counter() - t1
    return {"rows_s": round(loaded, 1), "graph_s": round(graph, 1)}


def measure(model: Path, index: Path, backend: str, queries: list[str]) -> dict[str, object]:
    config = PluginConfig.from_dict({"model": {"path": str(model)}, "backend": backend})
    plugin = OnnxClipPlugin()
    assert plugin.initialize(config), plugin.last_error
    stats = plugin.get_statistics()
    out: dict[str, object] = {"engine": f"{stats['backend']} {stats['precision']}"}
    try:
        plugin.generate_text_embedding("warm up")
        text = []
        for q in queries:
            t = time.perf_counter()
            plugin.generate_text_embedding(q)
            text.append((time.perf_counter() - t) * 1000)
        out["text"] = quantiles(text)
        with VectorIndex(index, readonly=True) as vi:
            vi.search(plugin.generate_text_embedding("warm up").embedding, 10)
            total = []
            for q in queries:
                t = time.perf_counter()
                hits = vi.search(plugin.generate_text_embedding(q + " again").embedding, 10)
                assert len(hits) == 10
                assert hits[0].path
                total.append((time.perf_counter() - t) * 1000)
            out["in_process"] = quantiles(total)
            out["search_mode"] = str(vi.mode)
    finally:
        plugin.shutdown()
    proc, base = serve(
        ["--model", str(model), "--index", str(index), "--backend", backend],
        {"THEMIS_ADMIN_TOKEN": "bench-token"},
    )
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            client.post("/search", json={"text": "warm up", "k": 10}).raise_for_status()
            http: list[float] = []
            shown: list[int] = []
            for q in queries:
                t = time.perf_counter()
                r = client.post("/search", json={"text": q + " over http", "k": 10})
                answer = r.json()
                http.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
                shown.append(len(answer["results"]))  # the relevance cut may end them early
            out["http"] = {**quantiles(http), "mean_results": round(statistics.mean(shown), 1)}
    finally:
        proc.terminate()
        proc.wait(30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--model", type=Path, default=HERE / "models" / "hf-vit-b-32")
    args = ap.parse_args()
    for line in cpu_lines():
        print(line)
    queries = captions(args.queries)
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "q.db"
        loader = OnnxClipPlugin(lazy_textual=True)
        assert loader.initialize(
            PluginConfig.from_dict({"model": {"path": str(args.model)}, "backend": "cpu"})
        ), loader.last_error
        built = build(index, loader, args.items)
        loader.shutdown()
        result: dict[str, object] = {"items": args.items, "build": built}
        for backend in ("auto", "cpu"):
            result[backend] = measure(args.model, index, backend, queries)
    auto, cpu = result["auto"], result["cpu"]
    assert isinstance(auto, dict)
    assert isinstance(cpu, dict)
    result["cpu_p50_over_auto_p50"] = {
        path: round(cpu[path]["p50_ms"] / auto[path]["p50_ms"], 2)
        for path in ("text", "in_process", "http")
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
