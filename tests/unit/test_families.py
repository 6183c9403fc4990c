"""The family table is the one place a family's rules live: the exporter's manifest and the
peers' layouts both derive from it (the torch parity of each family is in
tests/integration/test_families.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from themis_clip.models.families import FAMILIES, VisualInput, family
from themis_clip.models.peers import detect_peer_layout
from themis_clip.models.spec import TextSpec
from themis_clip.vocabulary import Padding, SpecialTokens, TextCleaning


def test_each_entry_is_keyed_by_its_model_type() -> None:
    assert set(FAMILIES) == {"clip", "siglip", "siglip2", "chinese_clip", "altclip"}
    for key, entry in FAMILIES.items():
        assert entry.model_type == key and family(key) is entry
    assert family("bert") is None and family(None) is None and family(3) is None


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_the_manifest_text_reads_back_as_the_familys_spec(model_type: str) -> None:
    entry = FAMILIES[model_type]
    written = entry.manifest_text
    assert json.loads(json.dumps(written)) == written  # plain JSON, as the manifest holds it
    if model_type == "clip":
        assert written == {}  # the CLIP path: nothing recorded, defaults everywhere
    spec, problems = TextSpec.parse(
        special_tokens=written.get("special_tokens", "clip"),
        padding=written.get("padding", "longest"),
        attention_mask=written.get("attention_mask"),
        clean=written.get("clean", "openai"),
        language_prefix=None,
        default_language=None,
    )
    assert problems == [] and spec == entry.text


def test_the_rules_the_exporter_and_peers_rely_on() -> None:
    siglip, siglip2 = FAMILIES["siglip"], FAMILIES["siglip2"]
    assert siglip.text.padding is Padding.MAX_LENGTH and siglip.text.attention_mask is False
    assert siglip.text.clean is TextCleaning.CANONICALIZE and siglip.pooler_is_embedding
    assert siglip2.visual is VisualInput.PATCHES and siglip2.text.clean is TextCleaning.LOWER
    for name in ("chinese_clip", "altclip"):
        entry = FAMILIES[name]
        assert entry.text.attention_mask is True and entry.context_from_tokenizer
        assert entry.text.special_tokens is SpecialTokens.TOKENIZER
    assert FAMILIES["altclip"].position_offset == 2 and FAMILIES["clip"].position_offset == 0


def xenova_dir(root: Path, model_type: str) -> Path:
    """A transformers.js folder's files (layout detection reads names and JSON, not graphs)."""
    (root / "onnx").mkdir(parents=True)
    for tower in ("vision_model", "text_model"):
        (root / "onnx" / f"{tower}.onnx").write_bytes(b"")
    config = {"model_type": model_type, "text_config": {"max_position_embeddings": 64}}
    (root / "config.json").write_text(json.dumps(config))
    (root / "preprocessor_config.json").write_text(
        json.dumps({"size": {"height": 32, "width": 32}, "do_center_crop": False})
    )
    (root / "tokenizer.json").write_text('{"model": {"vocab": {"<pad>": 0}}}')  # not CLIP BPE
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 16}))
    return root


@pytest.mark.parametrize("model_type", ["siglip", "chinese_clip"])
def test_transformers_js_follows_the_table(tmp_path: Path, model_type: str) -> None:
    spec = detect_peer_layout(xenova_dir(tmp_path, model_type), variant=None, name=None)
    assert spec is not None
    entry = FAMILIES[model_type]
    assert spec.pooler_is_embedding is entry.pooler_is_embedding
    assert spec.text.padding is entry.text.padding and spec.text.clean is entry.text.clean
    assert spec.text.special_tokens is SpecialTokens.TOKENIZER
    # SigLIP pools the last position: its whole table; others: the tokenizer's own context.
    assert spec.context_length == (64 if entry.text.padding is Padding.MAX_LENGTH else 16)
