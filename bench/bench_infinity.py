"""HTTP images and captions against infinity at 1/8/32 clients (issue 44, item 5).

The same CLIP weights on both sides: the random ViT-B/32 ``transformers`` checkpoint of
``make_models.py hf-vit-b-32`` (infinity loads the checkpoint with PyTorch; we serve its ONNX
export under the defaults a new user gets, i.e. AUTO). The same requests on both sides, in
OpenAI's form: one item per request, images as ``data:image/jpeg;base64,`` URLs of 1024x768
JPEGs, captions as distinct strings (no two requests of a run carry the same caption).

infinity 0.0.78 runs in its own virtual environment (``bench/.venv-infinity``, see
``bench/RESULTS.md`` for how it is set up with the CPU torch on disk). On a CPU its image
models run on the torch engine (its ``optimum`` engine takes text models only) and its
``--dtype`` has two settings that change anything there: ``auto``/``float32`` (fp32; float16
and bfloat16 are applied to image models only on CUDA) and ``int8`` (torch's dynamic
quantisation, "experimental" in its README). Both run by default.

Servers run one at a time (2 cores); before the timing each answers the same 4 images and 4
captions, and the lowest cosine between theirs and ours is printed (it checks that both
sides run the same weights and preprocessing). Prints items/s and p50 per client count, and
our ratio to each infinity setting.

Usage: PYTHONPATH=src:bench .venv/bin/python bench/bench_infinity.py [--seconds 10]
       [--clients 1,8,32] [--infinity-dtypes auto,int8]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_index_vs_rclip import MODEL, folder
from bench_openvino import cpu_lines
from make_models import MODELS, ensure_exported
from serving import serve

INFINITY = HERE / ".venv-infinity" / "bin" / "infinity_emb"
NOUNS = [
    "dog",
    "cat",
    "bicycle",
    "harbour",
    "mountain",
    "kitchen",
    "violin",
    "tram",
    "lighthouse",
    "orchard",
]
PLACES = [
    "beach",
    "street",
    "forest",
    "rooftop",
    "market",
    "station",
    "garden",
    "bridge",
    "desert",
    "library",
]


def captions(start: int, n: int) -> list[str]:
    """Distinct captions (a text cache, ours or theirs, cannot answer twice)."""
    return [
        f"a photo of a {NOUNS[i % 10]} near the {PLACES[i // 10 % 10]}, number {i}"
        for i in range(start, start + n)
    ]


def infinity_checkpoint(tmp: Path) -> Path:
    """The checkpoint as a transformers user gets it from the Hub: the tokenizer under its
    4.x class name (ours names transformers 5's ``TokenizersBackend``), and a tokenizer.json
    that adds the start and end tokens as OpenAI's does (``RobertaProcessing``; our runtime
    adds them itself, so the random checkpoint's tokenizer.json leaves them out)."""
    out = tmp / "clip"
    shutil.copytree(MODELS / "hf-vit-b-32-checkpoint", out)
    tok = json.loads((out / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    tok["post_processor"] = {
        "type": "RobertaProcessing",
        "sep": ["<|endoftext|>", ids["<|endoftext|>"]],
        "cls": ["<|startoftext|>", ids["<|startoftext|>"]],
        "trim_offsets": False,
        "add_prefix_space": False,
    }
    (out / "tokenizer.json").write_text(json.dumps(tok))
    conf = json.loads((out / "tokenizer_config.json").read_text())
    conf.update(tokenizer_class="CLIPTokenizerFast", model_max_length=77)
    conf.pop("backend", None)
    (out / "tokenizer_config.json").write_text(json.dumps(conf))
    return out


def start_infinity(ckpt: Path, dtype: str) -> tuple[subprocess.Popen[str], str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    env["INFINITY_ANONYMOUS_USAGE_STATS"] = "0"
    port = 7997
    proc = subprocess.Popen(
        [
            str(INFINITY),
            "v2",
            "--model-id",
            str(ckpt),
            "--port",
            str(port),
            "--device",
            "cpu",
            "--dtype",
            dtype,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, "infinity exited"
        assert time.monotonic() < deadline, "infinity never ready"
        try:
            models = httpx.get(f"{base}/models").json()["data"]
            return proc, base, models[0]["id"]
        except (httpx.HTTPError, KeyError, IndexError):
            time.sleep(0.5)


class Side:
    """One server: where it answers and how a one-item request is written."""

    def __init__(self, label: str, url: str, model: str | None) -> None:
        self.label, self.url, self.model = label, url, model

    def body(self, item: str, modality: str) -> dict[str, object]:
        out: dict[str, object] = {"input": [item], "modality": modality}
        if self.model:
            out["model"] = self.model
        return out

    def embed(self, client: httpx.Client, items: list[str], modality: str) -> np.ndarray:
        rows = []
        for item in items:
            r = client.post(self.url, json=self.body(item, modality))
            assert r.status_code == 200, r.text
            rows.append(r.json()["data"][0]["embedding"])
        out = np.asarray(rows, dtype=np.float64)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


async def load(
    side: Side, items: list[str], modality: str, k: int, seconds: float
) -> tuple[float, float]:
    """``k`` clients, one item a request, for ``seconds``: (items/s, p50 ms)."""
    lat: list[float] = []
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=k)) as client:

        async def one(j: int) -> None:
            i = j
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                r = await client.post(side.url, json=side.body(items[i % len(items)], modality))
                assert r.status_code == 200, r.text
                lat.append((time.perf_counter() - t0) * 1e3)
                i += k

        t0 = time.perf_counter()
        await asyncio.gather(*(one(j) for j in range(k)))
        wall = time.perf_counter() - t0
    return len(lat) / wall, statistics.median(lat)


def measure(
    side: Side, urls: list[str], ks: list[int], seconds: float
) -> dict[str, tuple[float, float]]:
    out = {}
    start = 0
    for modality in ("image", "text"):
        for k in ks:
            # items for the warm-up and the timed run; captions never repeat within a run
            n = 20000
            items = urls if modality == "image" else captions(start, n)
            start += n
            asyncio.run(load(side, items, modality, k, 2))
            items = urls if modality == "image" else captions(start, n)
            start += n
            out[f"{modality} {k}"] = asyncio.run(load(side, items, modality, k, seconds))
            rate, p50 = out[f"{modality} {k}"]
            print(
                f"  {side.label:28s} {modality:5s} {k:2d} clients: {rate:7.1f}/s  p50 {p50:7.1f} ms",
                flush=True,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--infinity-dtypes", default="auto,int8")
    args = ap.parse_args()
    ks = [int(k) for k in args.clients.split(",")]
    if not INFINITY.exists():
        raise SystemExit(f"{INFINITY} is missing: set it up as bench/RESULTS.md says")
    ensure_exported("hf-vit-b-32")
    urls = [
        "data:image/jpeg;base64," + base64.b64encode(p.read_bytes()).decode()
        for p in sorted(folder("1024x768", 48).glob("*.jpg"))
    ]
    check_imgs, check_caps = urls[:4], captions(10**6, 4)
    print("\n".join(cpu_lines()))
    print(f"1024x768 JPEGs; {args.seconds:.0f} s a cell")
    results: dict[str, dict[str, tuple[float, float]]] = {}
    proc, base = serve(["--model", str(MODEL)])
    try:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        ours = Side(
            f"themis-clip ({card['backend']} {card['precision']})", f"{base}/v1/embeddings", None
        )
        with httpx.Client(timeout=120) as c:
            ref_img, ref_cap = ours.embed(c, check_imgs, "image"), ours.embed(c, check_caps, "text")
        print(f"{ours.label}:", flush=True)
        results[ours.label] = measure(ours, urls, ks, args.seconds)
    finally:
        proc.terminate()
        proc.wait()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = infinity_checkpoint(Path(tmp))
        for dtype in args.infinity_dtypes.split(","):
            proc, base, model_id = start_infinity(ckpt, dtype)
            try:
                side = Side(f"infinity 0.0.78 (torch, {dtype})", f"{base}/embeddings", model_id)
                with httpx.Client(timeout=120) as c:
                    img, cap = side.embed(c, check_imgs, "image"), side.embed(c, check_caps, "text")
                cos_img = float((img * ref_img).sum(1).min())
                cos_cap = float((cap * ref_cap).sum(1).min())
                print(
                    f"{side.label}: lowest cosine to ours, images {cos_img:.5f}, captions {cos_cap:.5f}"
                )
                results[side.label] = measure(side, urls, ks, args.seconds)
            finally:
                proc.terminate()
                proc.wait()
    ours_label = next(iter(results))
    print("\nratio ours / infinity (items/s):")
    for label in list(results)[1:]:
        cells = ", ".join(
            f"{cell} {results[ours_label][cell][0] / results[label][cell][0]:.2f}x"
            for cell in results[label]
        )
        print(f"  vs {label}: {cells}")


if __name__ == "__main__":
    main()
