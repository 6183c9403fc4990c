"""Export of tiny random transformers CLIP checkpoints, checked against PyTorch (slow: torch)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")

from tests.helpers import photo_like  # noqa: E402
from themis_clip import OnnxClipPlugin, PluginConfig  # noqa: E402
from themis_clip.export.hf import create_random_checkpoint, export_hf_checkpoint, load_reference  # noqa: E402
from themis_clip.export.tokenizer import build_clip_tokenizer  # noqa: E402
from themis_clip.export.verify import verify_model  # noqa: E402

pytestmark = pytest.mark.slow

IMAGES = [photo_like(40 + 9 * i, 30 + 13 * i, i) for i in range(8)]
TEXTS = [
    "a",
    "a red circle",
    "a small blue triangle on the left of the picture",
    "",
    "green " * 100,
]
MIN_COSINE = {"fp32": 0.99999, "fp16": 0.999, "int8": 0.99}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    build_clip_tokenizer(root / "tokenizer.json")
    return create_random_checkpoint(
        root / "tiny-clip", root / "tokenizer.json", image_size=48, patch=8, seed=3
    )


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "model"
    export_hf_checkpoint(checkpoint, out, precisions=["fp32", "fp16", "int8"])
    return out


def reference_embeddings(checkpoint: Path, plugin: OnnxClipPlugin) -> tuple[np.ndarray, np.ndarray]:
    model = load_reference(checkpoint)
    assert plugin.get_statistics()["text_tower"]
    pixels = torch.from_numpy(np.stack([plugin.preprocess(i) for i in IMAGES]))
    rows = plugin.tokenize(TEXTS)
    with torch.no_grad():
        img = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
        txt = np.concatenate(
            [
                model.get_text_features(input_ids=torch.tensor([r])).pooler_output.numpy()
                for r in rows
            ]
        )
    norm = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    return norm(img), norm(txt)


def start(path: Path, **model: object) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(
        PluginConfig.from_dict({"model": {"path": str(path), **model}, "max_batch_size": 8})
    ), p.last_error
    return p


@pytest.mark.parametrize("variant", ["fp32", "fp16", "int8"])
def test_parity_with_pytorch(exported: Path, checkpoint: Path, variant: str) -> None:
    p = start(exported, variant=variant)
    ref_img, ref_txt = reference_embeddings(checkpoint, p)
    for batch in (1, 3, 8):  # several batch sizes reach the session
        got = np.stack([r.embedding for r in p.generate_embedding_batch(IMAGES[:batch])])
        cos = np.sum(got * ref_img[:batch], axis=1)
        assert cos.min() >= MIN_COSINE[variant], (variant, batch, cos.min())
        if variant == "fp32":
            assert np.abs(got - ref_img[:batch]).max() < 1e-5
    # Texts of different lengths in one batch: trimmed to the longest, padded with the pad id.
    got = np.stack([r.embedding for r in p.generate_text_embedding_batch(TEXTS)])
    cos = np.sum(got * ref_txt, axis=1)
    assert cos.min() >= MIN_COSINE[variant], (variant, cos.min())
    for i, text in enumerate(TEXTS):  # and one at a time (other sequence lengths)
        single = p.generate_text_embedding(text).embedding
        assert float(single @ ref_txt[i]) >= MIN_COSINE[variant]
    p.shutdown()


def test_manifest_and_axes(exported: Path) -> None:
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["embedding_dim"] == 32
    assert (
        manifest["visual"]["image_size"] == 48 and manifest["visual"]["resize_mode"] == "shortest"
    )
    assert manifest["visual"]["interpolation"] == "bicubic" and len(manifest["visual"]["mean"]) == 3
    assert manifest["textual"]["context_length"] == 77
    tok = json.loads((exported / "tokenizer.json").read_text())
    eot = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|endoftext|>")
    assert manifest["textual"]["pad_id"] == eot  # from the checkpoint's tokenizer_config.json
    assert set(manifest["variants"]) == {"fp16", "int8"}
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((exported / name).read_bytes()).hexdigest() == digest
    text = ort.InferenceSession(str(exported / "textual.onnx"))
    (ids,) = text.get_inputs()
    assert ids.name == "input_ids" and all(
        isinstance(d, str) for d in ids.shape
    )  # dynamic batch and sequence
    visual = ort.InferenceSession(str(exported / "visual.onnx"))
    assert (
        isinstance(visual.get_inputs()[0].shape[0], str)
        and visual.get_outputs()[0].name == "image_embeds"
    )
    sizes = {
        f: (exported / f).stat().st_size
        for f in ("visual.onnx", "visual.fp16.onnx", "visual.int8.onnx")
    }
    assert (
        sizes["visual.fp16.onnx"] < sizes["visual.onnx"]
        and sizes["visual.int8.onnx"] < sizes["visual.fp16.onnx"]
    )


def test_int8_depends_only_slightly_on_the_batch(exported: Path) -> None:
    # Dynamic int8 quantisation picks activation ranges per batch: documented, bounded here.
    p = start(exported, variant="int8")
    alone = p.generate_embedding(IMAGES[0]).embedding
    in_batch = p.generate_embedding_batch(IMAGES)[0].embedding
    assert float(alone @ in_batch) >= 0.99
    p.shutdown()


def test_external_data_export(checkpoint: Path, exported: Path, tmp_path: Path) -> None:
    out = tmp_path / "ext"
    export_hf_checkpoint(checkpoint, out, precisions=["fp32"], external_data_threshold_bytes=0)
    assert (out / "visual.onnx.data").is_file() and (out / "textual.onnx.data").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert "visual.onnx.data" in manifest["files"]
    assert (out / "visual.onnx").stat().st_size < (exported / "visual.onnx").stat().st_size / 2
    a, b = start(out), start(exported)
    c = start(out, enable_mmap_loading=True)
    assert c.get_statistics()["loading_mode"] == "mmap"
    for x, y, z in zip(
        a.generate_embedding_batch(IMAGES),
        b.generate_embedding_batch(IMAGES),
        c.generate_embedding_batch(IMAGES),
        strict=True,
    ):
        assert np.array_equal(x.embedding, y.embedding)
        assert np.abs(x.embedding - z.embedding).max() < 1e-6
    # The manifest's digests cover the external data: tampering is caught.
    with open(out / "visual.onnx.data", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x01\x02")
    digest = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    p = OnnxClipPlugin()
    assert not p.initialize(
        PluginConfig.from_dict({"model": {"path": str(out), "expected_sha256": digest}})
    )
    assert "visual.onnx.data" in (p.last_error or "")


def test_cli_export_and_verify(checkpoint: Path, exported: Path, tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "themis-clip")
    out = tmp_path / "cli-model"
    run = subprocess.run(  # the CLI's own export (fp32 only: the variants are the fixture's)
        [exe, "export", str(checkpoint), str(out), "--name", "tiny"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert "exported tiny: 32-d, 48 px" in run.stdout
    assert (out / "visual.onnx").is_file() and not (out / "visual.int8.onnx").exists()
    run = subprocess.run(  # verify the fixture's export (fp32, fp16, int8): built once
        [exe, "verify", str(exported), "--reference", str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert (
        sum(line.startswith("fp32") for line in lines) == 2
        and sum(line.startswith("int8") for line in lines) == 2
    )
    assert "NO" not in run.stdout
    again = subprocess.run(
        [exe, "export", str(checkpoint), str(out)], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 2 and "not empty" in again.stderr
    bad = subprocess.run(
        [exe, "export", str(tmp_path), str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no config.json" in bad.stderr


def test_int8_is_batch_independent_and_dynamic_int8_is_an_explicit_choice(
    checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "q"
    export_hf_checkpoint(checkpoint, out, precisions=["fp32", "int8", "int8-dynamic"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["variants"]) == {"int8", "int8-dynamic"}
    assert "built-in synthetic set" in manifest["calibration"]["int8"]
    rows = {(r.variant, r.modality): r for r in verify_model(out, checkpoint)}
    for modality in ("image", "text"):
        assert rows[("int8", modality)].batch_independent, modality
        assert rows[("int8", modality)].cosine_to_fp32 >= 0.99
        assert rows[("fp32", modality)].batch_independent
    # The same image alone and among different batch-mates of several sizes: the same bits.
    plugin = OnnxClipPlugin()
    assert plugin.initialize(
        PluginConfig.from_dict({"model": {"path": str(out), "variant": "int8"}})
    )
    rng = np.random.default_rng(5)
    probe = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
    alone = plugin.generate_embedding(probe).embedding
    for n in (2, 7, 32):
        mates = [rng.integers(0, 256, (50 + i, 70, 3), dtype=np.uint8) for i in range(n - 1)]
        batch = plugin.generate_embedding_batch([*mates[: n // 2], probe, *mates[n // 2 :]])
        assert np.array_equal(batch[n // 2].embedding, alone), n
    plugin.shutdown()


def test_int8_calibration_folder(checkpoint: Path, tmp_path: Path) -> None:
    from PIL import Image

    from themis_clip.export.quantize import add_int8_variant

    out = tmp_path / "m"
    export_hf_checkpoint(checkpoint, out, precisions=["fp32"])
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(6):
        Image.fromarray(photo_like(90, 70, i)).save(photos / f"{i}.jpg")
    (photos / "broken.jpg").write_bytes(b"not an image")  # skipped with a warning, not fatal
    assert add_int8_variant(out, calibration=photos).startswith("7 images from photos")
    assert (out / "visual.int8.onnx").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no images"):
        add_int8_variant(out, calibration=empty)
