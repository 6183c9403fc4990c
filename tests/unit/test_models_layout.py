from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from themis_clip import IntegrityError, ModelFormatError, ModelNotFoundError, ResizeMode
from themis_clip.models.layout import MANIFEST_NAME, model_identity_digest, resolve_model


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))


def edit_manifest(root: Path, **changes: object) -> None:
    path = root / MANIFEST_NAME
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_directory_layout(tiny_model_dir: Path) -> None:
    spec = resolve_model(tiny_model_dir)
    assert spec.layout == "themis" and spec.name == "tiny-a"
    assert spec.visual_path == tiny_model_dir / "visual.onnx"
    assert spec.textual_path == tiny_model_dir / "textual.onnx"
    assert spec.tokenizer_path == tiny_model_dir / "tokenizer.json"
    assert spec.image.image_size == 32 and spec.image.resize_mode is ResizeMode.SHORTEST
    assert spec.embedding_dim == 32 and spec.context_length == 77 and spec.pad_id == 0
    assert set(spec.declared_sha256) == {"visual.onnx", "textual.onnx", "tokenizer.json"}


def test_single_file_with_text_tower(tiny_model_dir: Path) -> None:
    spec = resolve_model(tiny_model_dir / "visual.onnx", text_path=tiny_model_dir / "textual.onnx")
    assert spec.layout == "file" and spec.name == "visual"
    assert spec.tokenizer_path == tiny_model_dir / "tokenizer.json"  # found beside the text tower


def test_missing_paths(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        resolve_model(tmp_path / "nothing")
    with pytest.raises(ModelFormatError, match="holds no model layout we know"):
        resolve_model(tmp_path)
    with pytest.raises(ModelNotFoundError):
        resolve_model(tiny_model_dir / "visual.onnx", text_path=tmp_path / "t.onnx")


def test_missing_file_named_by_manifest(model_copy: Path) -> None:
    (model_copy / "textual.onnx").unlink()
    with pytest.raises(ModelNotFoundError, match="textual.onnx"):
        resolve_model(model_copy)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "other"}, "format must be"),
        ({"format_version": 99}, "newer than this themis-clip supports"),
        ({"visual": None}, "visual is required"),
        ({"visual": {"file": "visual.onnx", "resize_mode": "zoom"}}, "resize_mode must be one of"),
        ({"visual": {"file": "visual.onnx", "image_size": "big"}}, "image_size must be int"),
        ({"visual": {"file": "visual.onnx", "mean": [1]}}, "mean must be three numbers"),
        ({"files": {"visual.onnx": 3}}, "files must map"),
    ],
)
def test_bad_manifest(model_copy: Path, changes: dict[str, object], message: str) -> None:
    edit_manifest(model_copy, **changes)
    with pytest.raises(ModelFormatError, match=message):
        resolve_model(model_copy)


def test_variants(model_copy: Path) -> None:
    shutil.copy(model_copy / "visual.onnx", model_copy / "visual.int8.onnx")
    edit_manifest(model_copy, variants={"int8": {"visual": "visual.int8.onnx"}})
    spec = resolve_model(model_copy, variant="int8")
    assert spec.variant == "int8" and spec.visual_path.name == "visual.int8.onnx"
    assert spec.textual_path is not None and spec.textual_path.name == "textual.onnx"
    with pytest.raises(ModelFormatError, match="no variant 'fp16'; available: fp32, int8"):
        resolve_model(model_copy, variant="fp16")


def test_identity_and_integrity(model_copy: Path) -> None:
    spec = resolve_model(model_copy)
    manifest_digest = sha(model_copy / MANIFEST_NAME)
    assert model_identity_digest(spec, None) == manifest_digest
    assert model_identity_digest(spec, manifest_digest) == manifest_digest
    with pytest.raises(IntegrityError, match="SHA-256 mismatch"):
        model_identity_digest(spec, "0" * 64)
    # The manifest vouches for each file: tampering with one is caught through it.
    with open(model_copy / "textual.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(IntegrityError, match="textual.onnx"):
        model_identity_digest(spec, manifest_digest)
    with pytest.raises(IntegrityError, match="textual.onnx"):
        model_identity_digest(spec, {"textual.onnx": spec.declared_sha256["textual.onnx"]})


def test_single_file_identity_uses_injected_hash(tiny_model_dir: Path) -> None:
    seen: list[Path] = []

    def fake_hash(path: Path) -> str:
        seen.append(path)
        return "ab" * 32

    spec = resolve_model(tiny_model_dir / "visual.onnx")
    assert model_identity_digest(spec, "AB" * 32, fake_hash) == "ab" * 32
    assert seen == [tiny_model_dir / "visual.onnx"]


@pytest.mark.parametrize(
    "text", ['{"a": NaN}', '{"a": Infinity}', '{"a": 1, "a": 2}', "{", b"\xff\xfe"]
)
def test_every_json_file_read_is_strict(tmp_path: Path, text: str | bytes) -> None:
    from themis_clip import jsonio
    from themis_clip.preprocess.text import pad_id_from_config

    path = tmp_path / "side.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(ValueError, match="side.json: not valid JSON"):
        jsonio.read(path)
    # A tokenizer_config.json that is not strict JSON declares no pad token: OpenAI's 0.
    path.write_bytes(b'{"pad_token": "a", "pad_token": "b"}')

    class Vocab:
        def token_to_id(self, token: str) -> int:
            return {"a": 7, "b": 8}[token]

    assert pad_id_from_config(path, Vocab()) == 0
    path.write_bytes(b'{"pad_token": "b"}')
    assert pad_id_from_config(path, Vocab()) == 8


@pytest.mark.parametrize(
    "changes",
    [
        {"visual": {"file": "/etc/passwd"}},
        {"visual": {"file": "../outside.onnx"}},
        {"visual": {"file": "sub/../../outside.onnx"}},
        {"visual": {"file": "visual.onnx"}, "textual": {"tokenizer": "/etc/passwd"}},
        {"visual": {"file": "visual.onnx"}, "textual": {"file": "../t.onnx"}},
        {"variants": {"int8": {"visual": "/etc/passwd"}}},
        {"files": {"../outside.onnx": "0" * 64}},
    ],
)
def test_a_manifest_name_leaving_the_folder_is_refused(
    model_copy: Path, changes: dict[str, object]
) -> None:
    shutil.copy(model_copy / "visual.onnx", model_copy.parent / "outside.onnx")
    edit_manifest(model_copy, **changes)
    with pytest.raises(ModelFormatError, match="leaves the model folder"):
        resolve_model(model_copy, variant="int8" if "variants" in changes else None)


@pytest.mark.parametrize("layout", ["themis", "immich"])
def test_a_link_leaving_the_folder_is_refused(
    model_copy: Path, tmp_path: Path, layout: str
) -> None:
    outside = tmp_path / "elsewhere.onnx"
    shutil.copy(model_copy / "visual.onnx", outside)
    tower = model_copy / "visual.onnx"
    if layout == "immich":  # a peer's fixed names are checked the same way
        (model_copy / MANIFEST_NAME).unlink()
        (model_copy / "visual").mkdir()
        tower = model_copy / "visual" / "model.onnx"
    tower.unlink(missing_ok=True)
    tower.symlink_to(outside)
    with pytest.raises(ModelFormatError, match="leaves the model folder"):
        resolve_model(model_copy)
    tower.unlink()
    shutil.copy(outside, tower)  # the same bytes inside the folder load
    resolve_model(model_copy)


def test_a_manifest_linked_out_of_the_folder_is_refused(model_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    shutil.move(model_copy / MANIFEST_NAME, outside)
    (model_copy / MANIFEST_NAME).symlink_to(outside)
    with pytest.raises(ModelFormatError, match="manifest.json leaves the model folder"):
        resolve_model(model_copy)


def test_a_link_loop_is_refused_not_a_crash(model_copy: Path) -> None:
    tower = model_copy / "visual.onnx"
    tower.unlink()
    tower.symlink_to(tower)
    with pytest.raises(ModelFormatError, match="leaves the model folder"):
        resolve_model(model_copy)


def test_a_hub_model_loads_only_files_of_its_verified_record(
    model_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from themis_clip import BackendType, PluginConfig, loading
    from themis_clip.models.hub import ModelSource, ResolvedModel

    recorded = {str(model_copy / n): sha(model_copy / n) for n in ("visual.onnx", "manifest.json")}

    def resolved(digests: dict[str, str]) -> ResolvedModel:
        source = ModelSource(text="someone/x", repo="someone/x")
        return ResolvedModel(path=model_copy, source=source, commit="0" * 40, digests=digests)

    config = PluginConfig.from_dict({"model": {"path": "someone/x"}})
    monkeypatch.setattr(loading, "resolve_source", lambda *a, **k: resolved(recorded))
    with pytest.raises(ModelFormatError, match="textual.onnx is not a file of its verified"):
        loading.load_model(config, BackendType.CPU)
    for name in ("textual.onnx", "tokenizer.json"):
        recorded[str(model_copy / name)] = sha(model_copy / name)
    assert loading.load_model(config, BackendType.CPU).retire(timeout_s=5)
