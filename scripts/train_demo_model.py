"""Train the shipped demo model: a small CLIP on generated scenes of coloured shapes.

Reproducible (seeded, CPU, 2 threads; 15-40 minutes, depending on load, on 2 cores):

    .venv/bin/python scripts/train_demo_model.py            # writes src/themis_clip/data/demo_model

1. A deterministic CLIP-style BPE tokenizer learned from the caption templates.
2. A pool of rendered scenes (shape, colour, size, position on a noisy background), passed
   through the project's own preprocessing to the model's 64 px input. Six colour+shape
   combinations are held out of training entirely; each of their colours and shapes still
   occurs with other partners, so zero-shot recognition of them tests composition.
3. A transformers ``CLIPModel`` (ViT 64 px / patch 8, width 96, 3 layers; text width 96,
   2 layers; 64-d embeddings) trained contrastively; captions of identical scenes are shared
   positives, so duplicates in a batch are not pushed apart.
4. Export through ``themis_clip.export.hf`` (fp32 + int8 variant) with the held-out
   combinations recorded in the manifest.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from themis_clip.demo.scenes import COLOURS, POSITIONS, SHAPES, SIZES, Scene, render_scene
from themis_clip.export.hf import create_random_checkpoint, export_hf_checkpoint
from themis_clip.export.tokenizer import build_clip_tokenizer
from themis_clip.models.spec import ImageSpec
from themis_clip.preprocess.image import ImagePreprocessor
from themis_clip.preprocess.text import CLIPTokenizer
from themis_clip.vocabulary import CLIP_MEAN, CLIP_STD

TARGET = Path(__file__).resolve().parents[1] / "src" / "themis_clip" / "data" / "demo_model"
HELD_OUT = [
    ("red", "triangle"),
    ("blue", "star"),
    ("green", "ring"),
    ("yellow", "cross"),
    ("purple", "square"),
    ("orange", "circle"),
]
IMAGE_SIZE = 64
VARIED_FRACTION = 0.75
TEMPLATES = [
    "a {colour} {shape}",
    "a {size} {colour} {shape}",
    "a {colour} {shape} {where}",
    "a {size} {colour} {shape} {where}",
    "a photo of a {colour} {shape}",
    "a picture of a {size} {colour} {shape} {where}",
    "{colour} {shape}",
]


def where(position: str) -> str:
    return "in the center" if position == "center" else f"on the {position}"


def caption(scene: Scene, rng: np.random.Generator) -> str:
    return str(rng.choice(TEMPLATES)).format(
        colour=scene.colour, shape=scene.shape, size=scene.size, where=where(scene.position)
    )


def corpus() -> list[str]:
    lines = []
    for c in COLOURS:
        for s in SHAPES:
            for z in SIZES:
                for p in POSITIONS:
                    lines += [
                        t.format(colour=c, shape=s, size=z, where=where(p)) for t in TEMPLATES
                    ]
    return lines


def sample_scene(rng: np.random.Generator, *, held_out: bool) -> Scene:
    while True:
        colour, shape = str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES))
        if ((colour, shape) in HELD_OUT) == held_out:
            return Scene(
                shape=shape,
                colour=colour,
                size=str(rng.choice(SIZES)),
                position=str(rng.choice(POSITIONS)),
                seed=int(rng.integers(0, 2**31)),
            )


_PREP = ImagePreprocessor(ImageSpec(image_size=IMAGE_SIZE, mean=CLIP_MEAN, std=CLIP_STD))


def render(args: tuple[Scene, int, bool]) -> np.ndarray:
    scene, size, varied = args
    return _PREP(np.asarray(render_scene(scene, size=size, varied=varied)))


def build_pool(n: int, seed: int, *, held_out: bool = False) -> tuple[np.ndarray, list[Scene]]:
    rng = np.random.default_rng(seed)
    scenes = [sample_scene(rng, held_out=held_out) for _ in range(n)]
    sizes = rng.integers(96, 225, n)
    # Most of the pool uses varied rendering (backgrounds, outlines, antialiasing, rotation,
    # JPEG artefacts) so that shapes drawn by other programs are recognised too.
    varied = (rng.random(n) < VARIED_FRACTION).tolist()
    with Pool(2) as pool:
        jobs = list(zip(scenes, sizes.tolist(), varied, strict=True))
        pixels = pool.map(render, jobs, chunksize=256)
    return np.stack(pixels).astype(np.float16), scenes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--pool", type=int, default=30000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=TARGET)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="themis-demo-"))
    build_clip_tokenizer(work / "tokenizer.json", corpus=corpus(), vocab_size=700)
    tokenizer = CLIPTokenizer(work / "tokenizer.json")
    ckpt = create_random_checkpoint(
        work / "checkpoint",
        work / "tokenizer.json",
        image_size=IMAGE_SIZE,
        patch=8,
        vision_width=96,
        vision_layers=3,
        vision_heads=4,
        text_width=96,
        text_layers=2,
        text_heads=4,
        projection_dim=64,
        seed=args.seed,
    )
    from transformers import CLIPModel

    model = CLIPModel.from_pretrained(str(ckpt), local_files_only=True)
    pixels, scenes = build_pool(args.pool, args.seed)
    keys = np.array([hash((s.colour, s.shape, s.size, s.position)) for s in scenes])
    print(f"pool: {len(scenes)} scenes in {time.perf_counter() - t_start:.0f} s", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup)
            * 0.5
            * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))
        ),
    )
    rng = np.random.default_rng(args.seed + 1)
    model.train()
    for step in range(args.steps):
        idx = rng.choice(len(scenes), args.batch, replace=False)
        rows = tokenizer.encode_batch([caption(scenes[i], rng) for i in idx]).rows
        ids, _ = tokenizer.pad(rows, max(len(r) for r in rows), np.dtype(np.int64))
        img = model.get_image_features(
            pixel_values=torch.from_numpy(pixels[idx].astype(np.float32))
        ).pooler_output
        txt = model.get_text_features(input_ids=torch.from_numpy(ids)).pooler_output
        img, txt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
        logits = model.logit_scale.exp().clamp(max=100) * img @ txt.T
        same = torch.from_numpy(keys[idx][:, None] == keys[idx][None, :]).float()
        target = same / same.sum(1, keepdim=True)
        loss = 0.5 * (
            torch.sum(-target * F.log_softmax(logits, 1), 1).mean()
            + torch.sum(-target * F.log_softmax(logits.T, 1), 1).mean()
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(
                f"step {step:5d} loss {loss.item():.3f} scale {model.logit_scale.exp().item():.1f} "
                f"{time.perf_counter() - t_start:.0f} s",
                flush=True,
            )
    model.eval()
    model.save_pretrained(str(ckpt))
    train_s = time.perf_counter() - t_start
    if args.out.exists():
        shutil.rmtree(args.out)
    demo = {
        "demo": {
            "held_out": [list(p) for p in HELD_OUT],
            "image_size": IMAGE_SIZE,
            "steps": args.steps,
            "batch": args.batch,
            "pool": args.pool,
            "seed": args.seed,
            "varied_fraction": VARIED_FRACTION,
            "train_seconds": round(train_s),
        }
    }
    report = export_hf_checkpoint(
        ckpt, args.out, precisions=["fp32", "int8"], name="themis-demo-shapes", extra_manifest=demo
    )
    print(
        json.dumps({"train_s": round(train_s), "files": report.files, "export_s": report.seconds}),
        flush=True,
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
