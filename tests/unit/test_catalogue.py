"""The model catalogue (data in the package) and how a model string is resolved (no network)."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import pytest

from themis_clip.errors import ModelFormatError, ModelNotFoundError
from themis_clip.models.catalogue import RepoLayout, catalogue, find_entry, parse_catalogue
from themis_clip.models.hub import detect_layout, parse_source, select_files


def _document() -> dict[str, object]:
    text = resources.files("themis_clip.models").joinpath("catalogue.json").read_text("utf-8")
    data = json.loads(text)
    assert isinstance(data, dict)
    return data


def test_every_entry_parses_and_names_are_unique() -> None:
    entries = catalogue()
    names = [e.name.lower() for e in entries]
    assert len(names) == len(set(names))
    assert all(e.layout in RepoLayout.ALL and e.repo.count("/") == 1 for e in entries)
    assert all(e.source for e in entries)  # every entry says where its figures come from


def test_the_catalogue_covers_what_users_run() -> None:
    repos = {e.repo for e in catalogue()}
    for repo in (
        "immich-app/ViT-B-32__openai",
        "immich-app/ViT-SO400M-16-SigLIP2-384__webli",
        "immich-app/nllb-clip-base-siglip__mrl",
        "immich-app/XLM-Roberta-Large-Vit-B-32",
        "Xenova/clip-vit-base-patch32",
        "Xenova/chinese-clip-vit-base-patch16",
        "Qdrant/clip-ViT-B-32-vision",
        "openai/clip-vit-large-patch14",
        "google/siglip2-base-patch16-224",
        "OFA-Sys/chinese-clip-vit-base-patch16",
        "BAAI/AltCLIP",
    ):
        assert repo in repos, repo
    families = {e.family for e in catalogue()}
    assert {"clip", "siglip", "siglip2", "nllb-siglip", "m-clip", "chinese-clip"} <= families
    vit_b32 = find_entry("vit-b-32__openai")  # case-insensitive
    assert vit_b32 is not None and (vit_b32.embedding_dim, vit_b32.image_size) == (512, 224)
    # A PyTorch checkpoint names the ready ONNX model to use without the export extra.
    pt = find_entry("openai/clip-vit-base-patch32")
    assert pt is not None and pt.layout == RepoLayout.PYTORCH
    assert pt.onnx_alternative is not None and find_entry(pt.onnx_alternative) is not None


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"name": None}, "name is required"),
        ({"layout": "tensorflow"}, "unknown layout"),
        ({"embedding_dim": "512"}, "embedding_dim must be int"),
        ({"repo": "no-slash"}, "repo must be org/name"),
        ({"colour": "red"}, "unknown fields"),
    ],
)
def test_a_bad_entry_is_refused(patch: dict[str, object], message: str) -> None:
    entry = {"name": "x", "repo": "a/b", "layout": "immich", "family": "clip", **patch}
    with pytest.raises(ModelFormatError, match=message):
        parse_catalogue({"format": "themis-clip-catalogue", "models": [entry]})
    dup = {"name": "x", "repo": "a/b", "layout": "immich", "family": "clip"}
    with pytest.raises(ModelFormatError, match="repeats"):
        parse_catalogue({"format": "themis-clip-catalogue", "models": [dup, dict(dup, name="X")]})


def test_resolution_rules(tmp_path: Path) -> None:
    # 1. an existing path wins, even when it looks like a repo id
    folder = tmp_path / "immich-app" / "ViT-B-32__openai"
    folder.mkdir(parents=True)
    assert parse_source(str(folder)).path == folder
    # 2/3. a catalogue name with a revision
    s = parse_source("ViT-B-32__openai@v1.2")
    assert (s.repo, s.revision, s.label) == (
        "immich-app/ViT-B-32__openai",
        "v1.2",
        "ViT-B-32__openai",
    )
    # 4. any org/name is a repo id, default revision main
    s = parse_source("someone/my-clip")
    assert (s.repo, s.revision, s.entry) == ("someone/my-clip", "main", None)
    # 5. unknown names suggest the closest catalogue names; missing paths say so
    with pytest.raises(ModelNotFoundError, match="did you mean ViT-B-32__openai"):
        parse_source("ViT-B32__openai")
    with pytest.raises(ModelNotFoundError, match="model path not found"):
        parse_source(str(tmp_path / "missing.onnx"))
    for bad in ("a/b@../../etc", "a/b@x\x00", "\x00", "\ud83d/x"):
        with pytest.raises(ModelNotFoundError):
            parse_source(bad)


def test_one_allow_list_per_layout() -> None:
    immich = [
        "config.json",
        "visual/model.onnx",
        "visual/preprocess_cfg.json",
        "visual/model.armnn",
        "visual/fp16/model.armnn",
        "visual/rknpu/rk3588/model.rknn",
        "textual/model.onnx",
        "textual/tokenizer.json",
        "README.md",
    ]
    assert detect_layout(immich) == RepoLayout.IMMICH
    assert select_files(immich, RepoLayout.IMMICH, None) == [
        "config.json",
        "textual/model.onnx",
        "textual/tokenizer.json",
        "visual/model.onnx",
        "visual/preprocess_cfg.json",
    ]
    xenova = [
        "config.json",
        "preprocessor_config.json",
        "tokenizer.json",
        *(f"onnx/{t}_model{s}.onnx" for t in ("vision", "text") for s in ("", "_q4", "_fp16")),
    ]
    assert detect_layout(xenova) == RepoLayout.TRANSFORMERS_JS
    assert [
        f for f in select_files(xenova, RepoLayout.TRANSFORMERS_JS, "fp16") if "onnx/" in f
    ] == [
        "onnx/text_model_fp16.onnx",
        "onnx/vision_model_fp16.onnx",
    ]
    with pytest.raises(ModelFormatError, match="no int8 variant"):
        select_files(xenova, RepoLayout.TRANSFORMERS_JS, "int8")
    with pytest.raises(ModelFormatError, match="fp32 ONNX towers only"):
        select_files(immich, RepoLayout.IMMICH, "fp16")
    pytorch = ["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5", "vocab.json"]
    assert detect_layout(pytorch) == RepoLayout.PYTORCH
    assert select_files(pytorch, RepoLayout.PYTORCH, None) == [
        "config.json",
        "model.safetensors",
        "vocab.json",
    ]
    assert detect_layout(["model.onnx", "config.json"]) == RepoLayout.FASTEMBED
    assert detect_layout(["weights.h5", "README.md"]) is None


def test_a_config_model_path_may_be_a_name(tmp_path: Path) -> None:
    from themis_clip.config import PluginConfig

    named = PluginConfig.from_dict({"model": {"path": "ViT-B-32__openai"}}, base_dir=tmp_path)
    assert named.model.path == "ViT-B-32__openai"
    (tmp_path / "ViT-B-32__openai").mkdir()  # an existing path beside the config wins
    local = PluginConfig.from_dict({"model": {"path": "ViT-B-32__openai"}}, base_dir=tmp_path)
    assert local.model.path == str(tmp_path / "ViT-B-32__openai")
    rel = PluginConfig.from_dict({"model": {"path": "./models/x"}}, base_dir=tmp_path)
    assert rel.model.path == os.path.join(tmp_path, "./models/x")  # a path, even if missing


def test_the_download_bar_shows_bytes_rate_and_eta() -> None:
    import io

    from themis_clip.models.hub.pull import progress_bar_class

    out = io.StringIO()
    bar_class = progress_bar_class()
    # As the client creates its byte bar: its own format (no ETA) is replaced by tqdm's.
    bar = bar_class(
        desc="Reconstructing",
        total=10_000_000,
        unit="B",
        unit_scale=True,
        file=out,
        bar_format="{desc}: {bar}| {n_fmt:>5}B",
        disable=False,
        mininterval=0,
    )
    bar.update(2_500_000)
    bar.close()
    text = out.getvalue()
    assert "2.50M/10.0M" in text and "B/s" in text and "<" in text  # bytes, rate, ETA
    hidden = bar_class(desc="Downloading bytes", total=0, file=out)
    assert hidden.disable
