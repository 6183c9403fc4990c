"""Helpers of the Hub tests: tiny repos in each layout we load, and ``themis-clip`` run against
:class:`tests.hub_server.FakeHub` (``HF_ENDPOINT``) as a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from onnx import TensorProto

from tests.helpers import ServerProcess
from themis_clip.export.tiny import (
    TextTowerSpec,
    VisionTowerSpec,
    build_text_tower,
    build_vision_tower,
)
from themis_clip.preprocess.text import CLIPTokenizer

EXE = shutil.which("themis-clip") or str(Path(sys.executable).parent / "themis-clip")
IMMICH = "immich-app/ViT-B-32__openai"
TOKEN = "hub-token"


def vocab(tok_file: Path) -> tuple[int, int]:
    tok = CLIPTokenizer(tok_file)
    return len(json.loads(tok_file.read_text())["model"]["vocab"]) + 2, tok.eot_id


def immich_repo(root: Path, tokenizer: Path) -> Path:
    size, eot = vocab(tokenizer)
    build_vision_tower(
        VisionTowerSpec(image_size=48, input_name="image", output_name="embedding", batch=1),
        root / "visual" / "model.onnx",
    )
    build_text_tower(
        TextTowerSpec(
            vocab_size=size,
            eot_id=eot,
            input_name="text",
            ids_dtype=TensorProto.INT32,
            output_name="embedding",
            batch=1,
            seq=77,
        ),
        root / "textual" / "model.onnx",
    )
    shutil.copy(tokenizer, root / "textual" / "tokenizer.json")
    (root / "config.json").write_text(
        json.dumps({"embed_dim": 32, "text_cfg": {"context_length": 77}})
    )
    (root / "visual" / "preprocess_cfg.json").write_text(
        json.dumps({"size": [48, 48], "mean": [0.5] * 3, "std": [0.5] * 3, "resize_mode": "squash"})
    )
    # Variants an immich repo also carries, which a pull must not fetch.
    for extra in (
        "visual/model.armnn",
        "visual/fp16/model.armnn",
        "visual/rknpu/rk3588/model.rknn",
    ):
        (root / extra).parent.mkdir(parents=True, exist_ok=True)
        (root / extra).write_bytes(b"not for us" * 500)
    return root


def xenova_repo(root: Path, tokenizer: Path) -> Path:
    size, eot = vocab(tokenizer)
    build_vision_tower(VisionTowerSpec(image_size=40, patch=8), root / "onnx" / "vision_model.onnx")
    build_vision_tower(
        VisionTowerSpec(image_size=40, patch=8, seed=3), root / "onnx" / "vision_model_int8.onnx"
    )
    build_text_tower(TextTowerSpec(vocab_size=size, eot_id=eot), root / "onnx" / "text_model.onnx")
    build_text_tower(
        TextTowerSpec(vocab_size=size, eot_id=eot, seed=9), root / "onnx" / "text_model_int8.onnx"
    )
    for q in ("q4", "fp16"):  # quantised files the pull must leave on the server
        (root / "onnx" / f"vision_model_{q}.onnx").write_bytes(b"x" * 5000)
    shutil.copy(tokenizer, root / "tokenizer.json")
    (root / "config.json").write_text(
        json.dumps({"projection_dim": 32, "text_config": {"max_position_embeddings": 77}})
    )
    (root / "preprocessor_config.json").write_text(
        json.dumps({"crop_size": {"height": 40, "width": 40}, "size": {"shortest_edge": 40}})
    )
    return root


def fastembed_repos(root: Path, tokenizer: Path) -> tuple[Path, Path]:
    size, eot = vocab(tokenizer)
    vision, text = root / "vision", root / "text"
    build_vision_tower(VisionTowerSpec(image_size=32, patch=8, seed=5), vision / "model.onnx")
    (vision / "preprocessor_config.json").write_text(json.dumps({"crop_size": 32}))
    build_text_tower(TextTowerSpec(vocab_size=size, eot_id=eot, seed=5), text / "model.onnx")
    shutil.copy(tokenizer, text / "tokenizer.json")
    return vision, text


def run(env: dict[str, str], *args: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    e = dict(env, HF_HUB_OFFLINE="1") if offline else env
    out = subprocess.run(
        [EXE, *args], capture_output=True, text=True, timeout=180, env=e, check=False
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out


def vectors(env: dict[str, str], model: str, photos: Path, **kw: bool) -> list[list[float]]:
    out = run(env, "embed", str(photos), "--text", "a red circle", "--model", model, **kw)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert all(r["ok"] for r in rows) and len(rows) == 4
    return [r["embedding"] for r in rows]


def cache_files(env: dict[str, str]) -> set[str]:
    root = Path(env["HF_HUB_CACHE"])
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def serve(env: dict[str, str], *args: str) -> ServerProcess:
    return ServerProcess(["--no-warmup", *args], env={**env, "THEMIS_ADMIN_TOKEN": TOKEN})
