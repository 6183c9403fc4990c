"""Model families beyond OpenAI CLIP, exported from tiny random transformers checkpoints (slow).

Each family's checkpoint is built here with a small tokenizer of the right kind, trained by
``tokenizers`` in the test; our export must match PyTorch's ``get_image_features`` /
``get_text_features`` (normalised) on the same weights, with token ids made by an independent
restatement of the family's text rule (open_clip's cleaning, the tokenizer's own special tokens,
the family's padding), and zero-shot probabilities must equal PyTorch's.
"""

from __future__ import annotations

import html
import json
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.helpers import photo_like  # noqa: E402
from themis_clip import OnnxClipPlugin, PluginConfig  # noqa: E402
from themis_clip.errors import ModelFormatError  # noqa: E402
from themis_clip.export.hf import export_hf_checkpoint, load_reference  # noqa: E402

pytestmark = pytest.mark.slow

IMAGES = [photo_like(40 + 9 * i, 30 + 13 * i, i) for i in range(3)]
TEXTS = [
    "A photo of a CAT!",
    "dog_on_a_sofa, (sleeping)",
    "a red car " * 40,  # longer than the context: truncated, EOS kept
    "",
]
CORPUS = [
    "a photo of a cat",
    "a dog on a sofa sleeping",
    "a red car on a long street",
    "the sky is blue and the tree is green",
    "two people walking on the beach at sunset",
] * 20


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


# -- SigLIP ------------------------------------------------------------------------------------


def siglip_tokenizer(path: Path) -> None:
    """A SentencePiece-style Unigram tokenizer as SigLIP's: ``</s>`` appended, pad = EOS = 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {"pad_token": "</s>", "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 16}
        )
    )


#: SigLIP's (and SigLIP 2's) tiny text tower: context 16, pad = EOS = 1, last-token pooling
SIGLIP_TEXT: dict[str, Any] = {
    "vocab_size": 200,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 16,
    "projection_size": 32,
    "pad_token_id": 1,
    "eos_token_id": 1,
    "bos_token_id": None,
}


@pytest.fixture(scope="module")
def siglip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("siglip")
    ckpt = root / "tiny-siglip"
    ckpt.mkdir()
    siglip_tokenizer(ckpt)
    torch.manual_seed(7)
    config = transformers.SiglipConfig(
        text_config=SIGLIP_TEXT,
        vision_config={
            "image_size": 32,
            "patch_size": 8,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
        },
    )
    model = transformers.SiglipModel(config).eval()
    with torch.no_grad():  # a bias and scale unlike the initial ones, so that scoring shows them
        model.logit_scale.fill_(2.0)
        model.logit_bias.fill_(-3.0)
    model.save_pretrained(ckpt)
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(ckpt)
    out = root / "model"
    export_hf_checkpoint(ckpt, out, precisions=["fp32"])
    return ckpt, out


def open_clip_canonicalize(text: str) -> str:
    """open_clip's ``canonicalize_text(basic_clean(text))``, restated."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    text = text.replace("_", " ").translate(str.maketrans("", "", string.punctuation)).lower()
    return " ".join(text.split()).strip()


def reference_ids(ckpt: Path, texts: list[str], length: int) -> list[list[int]]:
    """What open_clip's HF tokenizer wrapper feeds SigLIP: padding and truncation to max_length."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.enable_truncation(length)
    tok.enable_padding(length=length, pad_id=1, pad_token="</s>")
    return [e.ids for e in tok.encode_batch([open_clip_canonicalize(t) for t in texts])]


def start(path: Path) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(
        PluginConfig.from_dict({"model": {"path": str(path)}, "max_batch_size": 8})
    ), p.last_error
    return p


def test_siglip_export_matches_pytorch(siglip: tuple[Path, Path]) -> None:
    ckpt, out = siglip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["visual"]["resize_mode"] == "squash" and manifest["visual"]["mean"] == [0.5] * 3
    text = manifest["textual"]
    assert (text["padding"], text["special_tokens"], text["clean"], text["attention_mask"]) == (
        "max_length",
        "tokenizer",
        "canonicalize",
        False,
    )
    assert text["context_length"] == 16 and text["pad_id"] == 1
    assert manifest["scoring"] == {"logit_scale": pytest.approx(np.exp(2.0)), "logit_bias": -3.0}
    model = load_reference(ckpt)
    p = start(out)
    assert p.is_ready()
    pixels = torch.from_numpy(np.stack([p.preprocess(i) for i in IMAGES]))
    ids = reference_ids(ckpt, TEXTS, 16)
    assert ids[2][-1] == 1 and len(ids[2]) == 16  # truncated, EOS kept last
    with torch.no_grad():
        ref_img = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
        ref_txt = model.get_text_features(input_ids=torch.tensor(ids)).pooler_output.numpy()
    got_img = np.stack([r.embedding for r in p.generate_embedding_batch(IMAGES)])
    assert cosines(got_img, ref_img).min() >= 0.99999
    # One mixed-length batch: every row padded to the full 16 (last-token pooling).
    results = p.generate_text_embedding_batch(TEXTS)
    got_txt = np.stack([r.embedding for r in results])
    assert cosines(got_txt, ref_txt).min() >= 0.99999, cosines(got_txt, ref_txt)
    from tokenizers import Tokenizer

    plain = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    lengths = [len(plain.encode(open_clip_canonicalize(t)).ids) for t in TEXTS]
    assert [r.truncated for r in results] == [n > 16 for n in lengths]
    assert results[2].truncated and not results[3].truncated
    for i, t in enumerate(TEXTS):  # and one at a time
        single = p.generate_text_embedding(t).embedding
        assert float(cosines(single[None], ref_txt[i : i + 1])[0]) >= 0.99999
    # The padding rule is what makes it right: pooling an unpadded row gives another vector.
    unpadded = p.tokenize(["a cat"])
    with torch.no_grad():
        trimmed = model.get_text_features(input_ids=torch.tensor(unpadded)).pooler_output.numpy()
        padded = model.get_text_features(
            input_ids=torch.tensor(reference_ids(ckpt, ["a cat"], 16))
        ).pooler_output.numpy()
    ours = p.generate_text_embedding("a cat").embedding[None]  # type: ignore[index]
    assert float(cosines(ours, padded)[0]) >= 0.99999
    assert float(cosines(ours, trimmed)[0]) < 0.999


def test_siglip_zero_shot_is_a_sigmoid_with_the_checkpoints_bias(siglip: tuple[Path, Path]) -> None:
    ckpt, out = siglip
    model = load_reference(ckpt)
    p = start(out)
    assert p.is_ready()
    labels = ["cat", "dog on a sofa", "red car"]
    prompts = [f"a photo of a {x}" for x in labels]
    pixels = torch.from_numpy(np.stack([p.preprocess(i) for i in IMAGES]))
    ids = torch.tensor(reference_ids(ckpt, prompts, 16))
    with torch.no_grad():
        expected = torch.sigmoid(model(input_ids=ids, pixel_values=pixels).logits_per_image).numpy()
    for i, image in enumerate(IMAGES):
        got = np.array([s.probability for s in p.classify(image, labels)])
        assert np.abs(got - expected[i]).max() < 1e-5, (got, expected[i])


def edited_copy(model: Path, target: Path, edit: Callable[[dict[str, Any]], object]) -> Path:
    """A copy of a model directory whose manifest ``edit`` changed."""
    import shutil

    shutil.copytree(model, target)
    manifest = json.loads((target / "manifest.json").read_text())
    edit(manifest)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_a_tokenizer_that_does_not_fit_the_family_is_refused(
    siglip: tuple[Path, Path], tmp_path: Path
) -> None:

    from themis_clip.export.tokenizer import build_clip_tokenizer

    broken = edited_copy(
        siglip[1], tmp_path / "broken", lambda m: m["files"].pop("tokenizer.json", None)
    )
    build_clip_tokenizer(broken / "tokenizer.json")  # a CLIP BPE file: no post-processor EOS
    p = OnnxClipPlugin()
    assert not p.initialize(PluginConfig.from_dict({"model": {"path": str(broken)}}))
    assert "adds no special tokens" in (p.last_error or "")


def test_declared_mask_without_a_mask_input_is_refused(
    siglip: tuple[Path, Path], tmp_path: Path
) -> None:

    broken = edited_copy(
        siglip[1], tmp_path / "mask", lambda m: m["textual"].update(attention_mask=True)
    )
    manifest: dict[str, Any] = json.loads((broken / "manifest.json").read_text())
    p = OnnxClipPlugin()
    assert not p.initialize(PluginConfig.from_dict({"model": {"path": str(broken)}}))
    assert "declares that its text tower takes an attention mask" in (p.last_error or "")
    manifest["textual"]["padding"] = "sideways"
    (broken / "manifest.json").write_text(json.dumps(manifest))
    from themis_clip.models.layout import resolve_model

    with pytest.raises(ModelFormatError, match="padding must be one of longest, max_length"):
        resolve_model(broken)


def test_language_prefix_is_required_glued_and_reaches_http(
    siglip: tuple[Path, Path], tmp_path: Path
) -> None:
    import shutil

    from fastapi.testclient import TestClient
    from tokenizers import Tokenizer

    from themis_clip.server import ServerSettings, create_app

    ckpt, out = siglip
    nllb = tmp_path / "nllb-like"
    shutil.copytree(out, nllb)
    manifest: dict[str, Any] = json.loads((nllb / "manifest.json").read_text())
    manifest["textual"]["language_prefix"] = "flores200"
    (nllb / "manifest.json").write_text(json.dumps(manifest))
    p = start(nllb)
    missing = p.generate_text_embedding("a cat")
    assert not missing.ok and "needs a language code" in (missing.error or "")
    assert missing.error_type == "TextInputError"
    bad = p.generate_text_embedding("a cat", language="english")
    assert not bad.ok and "not a Flores-200 code" in (bad.error or "")
    assert p.get_statistics()["text_tower"]
    rows = p.tokenize(["A cat!"], "deu_Latn")
    plain = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    assert rows[0] == plain.encode("deu_Latn" + open_clip_canonicalize("A cat!")).ids[:16]
    de = p.generate_text_embedding("A cat!", language="deu_Latn").embedding
    en = p.generate_text_embedding("A cat!", language="eng_Latn").embedding
    assert de is not None and en is not None and float(de @ en) < 0.9999  # the code matters
    app = create_app(
        ServerSettings(
            plugin_config=PluginConfig.from_dict({"model": {"path": str(nllb)}}), warmup=False
        )
    )
    with TestClient(app) as c:
        r = c.post("/embed/text", json={"texts": ["A cat!", "x"], "language": "deu_Latn"})
        assert r.status_code == 200, r.text
        assert np.allclose(r.json()["embeddings"][0], de, atol=1e-6)
        r = c.post("/embed/text", json={"text": "A cat!"})
        assert r.status_code == 422 and "needs a language code" in r.json()["error"]["message"]
        r = c.post("/v1/embeddings", json={"input": ["A cat!"], "language": "eng_Latn"})
        assert r.status_code == 200 and np.allclose(r.json()["data"][0]["embedding"], en, atol=1e-6)
    # A model with a default language needs none from the caller.
    manifest["textual"]["default_language"] = "eng_Latn"
    (nllb / "manifest.json").write_text(json.dumps(manifest))
    q = start(nllb)
    default = q.generate_text_embedding("A cat!").embedding
    assert default is not None and np.allclose(default, en, atol=1e-6)


# -- BERT (Chinese-CLIP) and XLM-R (AltCLIP) text towers: the mask is an input -------------------

CJK_CORPUS = [
    "一只猫的照片",
    "海边的日落",
    "a photo of a cat",
    "红色的汽车停在街上",
    "two dogs playing in the park",
] * 20
MASKED_TEXTS = [
    "一只猫的照片",
    "A photo of a CAT",
    "红色的汽车停在很长很长很长很长很长的街上 " * 5,
    "海边",
]


def wordpiece_tokenizer(path: Path, context: int) -> None:
    """A BERT WordPiece tokenizer (lower-casing, CJK characters split): [CLS] text [SEP]."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        CJK_CORPUS, trainers.WordPieceTrainer(vocab_size=300, special_tokens=special)
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"pad_token": "[PAD]", "unk_token": "[UNK]", "model_max_length": context})
    )


def xlmr_tokenizer(path: Path, context: int) -> None:
    """An XLM-R-style SentencePiece (Unigram) tokenizer: <s> text </s>, pad id 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    tok.train_from_iterator(
        CJK_CORPUS,
        trainers.UnigramTrainer(vocab_size=300, special_tokens=special, unk_token="<unk>"),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": context})
    )


def _tiny_vision() -> dict[str, Any]:
    return {
        "image_size": 32,
        "patch_size": 8,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    }


@pytest.fixture(scope="module", params=["chinese_clip", "altclip"])
def masked(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    family = request.param
    root = tmp_path_factory.mktemp(family)
    ckpt = root / "ckpt"
    ckpt.mkdir()
    torch.manual_seed(11)
    text = {
        "vocab_size": 300,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    }
    if family == "chinese_clip":
        wordpiece_tokenizer(ckpt, 12)
        config = transformers.ChineseCLIPConfig(
            text_config={**text, "max_position_embeddings": 64, "pad_token_id": 0},
            vision_config=_tiny_vision(),
            projection_dim=16,
        )
        model = transformers.ChineseCLIPModel(config).eval()
        processor = transformers.ChineseCLIPImageProcessor(
            size={"height": 32, "width": 32}, do_center_crop=False
        )
    else:
        xlmr_tokenizer(ckpt, 12)
        config = transformers.AltCLIPConfig(
            text_config={
                **text,
                "max_position_embeddings": 40,
                "project_dim": 16,
                "pad_token_id": 1,
                "bos_token_id": 0,
                "eos_token_id": 2,
            },
            vision_config=_tiny_vision(),
            projection_dim=16,
        )
        model = transformers.AltCLIPModel(config).eval()
        processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size=32)
    model.save_pretrained(ckpt)
    processor.save_pretrained(ckpt)
    out = root / "model"
    export_hf_checkpoint(ckpt, out, precisions=["fp32"])
    return family, ckpt, out


def test_masked_text_families_match_pytorch(masked: tuple[str, Path, Path]) -> None:
    from tokenizers import Tokenizer

    family, ckpt, out = masked
    manifest = json.loads((out / "manifest.json").read_text())
    text = manifest["textual"]
    assert (text["attention_mask"], text["padding"], text["special_tokens"]) == (
        True,
        "longest",
        "tokenizer",
    )
    assert text["context_length"] == 12
    expected_mode = "squash" if family == "chinese_clip" else "shortest"
    assert manifest["visual"]["resize_mode"] == expected_mode
    model = load_reference(ckpt)
    p = start(out)
    text_input = p.get_statistics()["text_input"]
    assert text_input is not None and text_input["attention_mask"]
    pixels = torch.from_numpy(np.stack([p.preprocess(i) for i in IMAGES]))
    # The reference ids: the tokenizer's own rule, padded to the longest row, with its mask.
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.enable_truncation(12)
    pad_id = 0 if family == "chinese_clip" else 1
    tok.enable_padding(pad_id=pad_id)
    enc = tok.encode_batch(MASKED_TEXTS)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        ref_img = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
        ref_txt = model.get_text_features(input_ids=ids, attention_mask=mask).pooler_output.numpy()
    got_img = np.stack([r.embedding for r in p.generate_embedding_batch(IMAGES)])
    assert cosines(got_img, ref_img).min() >= 0.99999
    results = p.generate_text_embedding_batch(MASKED_TEXTS)
    got = np.stack([r.embedding for r in results])
    assert cosines(got, ref_txt).min() >= 0.99999, cosines(got, ref_txt)
    plain = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    assert [r.truncated for r in results] == [len(plain.encode(t).ids) > 12 for t in MASKED_TEXTS]
    assert results[2].truncated
    for i, t in enumerate(MASKED_TEXTS):  # one at a time: another padded length, same vector
        single = p.generate_text_embedding(t).embedding
        assert float(cosines(single[None], ref_txt[i : i + 1])[0]) >= 0.99999
    # Zero-shot: softmax over scaled cosines, equal to PyTorch's logits_per_image.
    with torch.no_grad():
        probs = model(
            input_ids=ids, attention_mask=mask, pixel_values=pixels
        ).logits_per_image.softmax(-1)
    for i, image in enumerate(IMAGES):
        got_p = np.array([s.probability for s in p.classify(image, MASKED_TEXTS, template="{}")])
        assert np.abs(got_p - probs[i].numpy()).max() < 1e-5


# -- DFN / MetaCLIP / LAION: CLIPModel with either activation, squash preprocessing -------------


@pytest.mark.parametrize("act", ["quick_gelu", "gelu"])
def test_dfn_metaclip_style_clip_matches_pytorch(act: str, tmp_path: Path) -> None:
    from themis_clip.export.hf import create_random_checkpoint
    from themis_clip.export.tokenizer import build_clip_tokenizer

    build_clip_tokenizer(tmp_path / "tokenizer.json")
    ckpt = create_random_checkpoint(tmp_path / "ckpt", tmp_path / "tokenizer.json", seed=13)
    config = json.loads((ckpt / "config.json").read_text())
    for tower in ("text_config", "vision_config"):
        config[tower]["hidden_act"] = act
    (ckpt / "config.json").write_text(json.dumps(config))
    pre = json.loads((ckpt / "preprocessor_config.json").read_text())
    pre.update(do_center_crop=False, size={"height": 32, "width": 32})  # dfn5b: squash
    pre.pop("crop_size", None)
    (ckpt / "preprocessor_config.json").write_text(json.dumps(pre))
    out = tmp_path / "model"
    export_hf_checkpoint(ckpt, out, precisions=["fp32"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["visual"]["resize_mode"] == "squash"
    assert manifest["textual"].get("padding", "longest") == "longest"  # the CLIP path, unchanged
    model = load_reference(ckpt)
    assert model.config.vision_config.hidden_act == act
    p = start(out)
    assert p.get_statistics()["text_tower"]
    pixels = torch.from_numpy(np.stack([p.preprocess(i) for i in IMAGES]))
    texts = ["a photo of a cat", "", "green " * 100]
    rows = p.tokenize(texts)
    with torch.no_grad():
        ref_img = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
        ref_txt = np.concatenate(
            [
                model.get_text_features(input_ids=torch.tensor([r])).pooler_output.numpy()
                for r in rows
            ]
        )
    got_img = np.stack([r.embedding for r in p.generate_embedding_batch(IMAGES)])
    got_txt = np.stack([r.embedding for r in p.generate_text_embedding_batch(texts)])
    assert cosines(got_img, ref_img).min() >= 0.99999
    assert cosines(got_txt, ref_txt).min() >= 0.99999


# -- the same weights in peers' layouts --------------------------------------------------------


def rename_io(src: Path, dst: Path, names: dict[str, str]) -> None:
    """Copy an ONNX graph with some inputs/outputs renamed (as peers name them)."""
    import onnx

    model = onnx.load(str(src))
    g = model.graph
    used = {n for node in g.node for n in (*node.input, *node.output)}
    used |= {i.name for i in g.initializer} | {v.name for v in g.value_info}
    names = dict(names)
    for target in list(names.values()):  # an internal value already called so moves aside
        if target in used and target not in names:
            names[target] = target + "__internal"
    for value in list(g.input) + list(g.output) + list(g.value_info) + list(g.initializer):
        value.name = names.get(value.name, value.name)
    for node in g.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))


def siglip_references(
    ckpt: Path, texts: list[str], prefix: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    from tokenizers import Tokenizer

    model = load_reference(ckpt)
    proc = transformers.SiglipImageProcessor.from_pretrained(str(ckpt))
    del proc  # the processor's numbers are in the manifest; pixels come from the reference below
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.enable_truncation(16)
    tok.enable_padding(length=16, pad_id=1, pad_token="</s>")
    ids = [e.ids for e in tok.encode_batch([prefix + open_clip_canonicalize(t) for t in texts])]
    from PIL import Image

    pixels = np.stack(
        [
            (
                np.asarray(Image.fromarray(i).resize((32, 32), Image.BICUBIC), dtype=np.float64)
                / 255
                - 0.5
            )
            / 0.5
            for i in IMAGES
        ]
    ).transpose(0, 3, 1, 2)
    with torch.no_grad():
        img = model.get_image_features(
            pixel_values=torch.from_numpy(pixels).float()
        ).pooler_output.numpy()
        txt = model.get_text_features(input_ids=torch.tensor(ids)).pooler_output.numpy()
    return img, txt


def test_siglip_in_immich_and_transformers_js_layouts(
    siglip: tuple[Path, Path], tmp_path: Path
) -> None:
    import shutil

    ckpt, out = siglip
    ref_img, ref_txt = siglip_references(ckpt, TEXTS)
    # immich: visual/ + textual/ with its own I/O names, config.json's text_cfg, preprocess_cfg.
    for label in ("ViT-B-16-SigLIP__webli", "nllb-clip-base-siglip__v1"):
        root = tmp_path / label
        rename_io(
            out / "visual.onnx",
            root / "visual" / "model.onnx",
            {"pixel_values": "image", "image_embeds": "embedding"},
        )
        rename_io(
            out / "textual.onnx",
            root / "textual" / "model.onnx",
            {"input_ids": "text", "text_embeds": "embedding"},
        )
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(ckpt / f, root / "textual" / f)
        (root / "config.json").write_text(
            json.dumps(
                {
                    "embed_dim": 32,
                    "text_cfg": {
                        "context_length": 16,
                        "tokenizer_kwargs": {"clean": "canonicalize"},
                    },
                }
            )
        )
        (root / "visual" / "preprocess_cfg.json").write_text(
            json.dumps(
                {
                    "size": [32, 32],
                    "mean": [0.5] * 3,
                    "std": [0.5] * 3,
                    "interpolation": "bicubic",
                    "resize_mode": "squash",
                }
            )
        )
        p = start(root)
        assert p.model_spec is not None and p.model_spec.layout.value == "immich"
        got_img = np.stack([r.embedding for r in p.generate_embedding_batch(IMAGES)])
        assert cosines(got_img, ref_img).min() >= 0.99999
        got = np.stack([r.embedding for r in p.generate_text_embedding_batch(TEXTS)])
        if label.startswith("nllb"):  # a language code glued in front; immich's default: English
            _, ref_en = siglip_references(ckpt, TEXTS, prefix="eng_Latn")
            _, ref_de = siglip_references(ckpt, TEXTS, prefix="deu_Latn")
            assert cosines(got, ref_en).min() >= 0.99999
            de = np.stack([r.embedding for r in p.generate_text_embedding_batch(TEXTS, "deu_Latn")])
            assert cosines(de, ref_de).min() >= 0.99999
        else:
            assert cosines(got, ref_txt).min() >= 0.99999
    # transformers.js: onnx/{vision,text}_model.onnx whose pooler_output is SigLIP's embedding.
    root = tmp_path / "Xenova-siglip"
    rename_io(
        out / "visual.onnx", root / "onnx" / "vision_model.onnx", {"image_embeds": "pooler_output"}
    )
    rename_io(
        out / "textual.onnx", root / "onnx" / "text_model.onnx", {"text_embeds": "pooler_output"}
    )
    for f in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(ckpt / f, root / f)
    (root / "config.json").write_text(
        json.dumps({"model_type": "siglip", "text_config": {"max_position_embeddings": 16}})
    )
    p = start(root)
    assert p.model_spec is not None and p.model_spec.image.resize_mode.value == "squash"
    got_img = np.stack([r.embedding for r in p.generate_embedding_batch(IMAGES)])
    got = np.stack([r.embedding for r in p.generate_text_embedding_batch(TEXTS)])
    assert cosines(got_img, ref_img).min() >= 0.99999
    assert cosines(got, ref_txt).min() >= 0.99999


def test_masked_families_in_peers_layouts(masked: tuple[str, Path, Path], tmp_path: Path) -> None:
    """Chinese-CLIP as transformers.js ships it; M-CLIP-style XLM-R as clip-as-service does."""
    import shutil

    from tokenizers import Tokenizer

    family, ckpt, out = masked
    if family == "chinese_clip":
        root = tmp_path / "Xenova-chinese-clip"
        rename_io(out / "visual.onnx", root / "onnx" / "vision_model.onnx", {})
        rename_io(out / "textual.onnx", root / "onnx" / "text_model.onnx", {})
        files = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json")
        (root / "config.json").parent.mkdir(parents=True, exist_ok=True)
        (root / "config.json").write_text(
            json.dumps(
                {
                    "model_type": "chinese_clip",
                    "projection_dim": 16,
                    "text_config": {"max_position_embeddings": 64},
                }
            )
        )
    else:
        root = tmp_path / "M-CLIP-cas"
        root.mkdir()
        shutil.copy(out / "visual.onnx", root / "visual.onnx")
        shutil.copy(out / "textual.onnx", root / "textual.onnx")
        files = ("tokenizer.json", "tokenizer_config.json")
    for f in files:
        shutil.copy(ckpt / f, root / f)
    p = start(root)
    text_input = p.get_statistics()["text_input"]
    assert text_input is not None and text_input["attention_mask"]
    assert text_input["context_length"] == 12
    model = load_reference(ckpt)
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.enable_truncation(12)
    tok.enable_padding(pad_id=0 if family == "chinese_clip" else 1)
    enc = tok.encode_batch(MASKED_TEXTS)
    with torch.no_grad():
        ref = model.get_text_features(
            input_ids=torch.tensor([e.ids for e in enc]),
            attention_mask=torch.tensor([e.attention_mask for e in enc]),
        ).pooler_output.numpy()
        pixels = torch.from_numpy(np.stack([p.preprocess(i) for i in IMAGES]))
        ref_img = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    got = np.stack([r.embedding for r in p.generate_text_embedding_batch(MASKED_TEXTS)])
    assert cosines(got, ref).min() >= 0.99999
    got_img = np.stack([r.embedding for r in p.generate_embedding_batch(IMAGES)])
    assert cosines(got_img, ref_img).min() >= 0.99999


# -- SigLIP 2 at a fixed resolution (the NaFlex tower fed squashed S x S images) ---------------


def test_siglip2_fixed_resolution_export_matches_pytorch(tmp_path: Path) -> None:
    ckpt = tmp_path / "tiny-siglip2"
    ckpt.mkdir()
    siglip_tokenizer(ckpt)  # a SentencePiece stand-in for Gemma's (same post-processing rule)
    torch.manual_seed(17)
    config = transformers.Siglip2Config(
        text_config=SIGLIP_TEXT,
        vision_config={
            "num_patches": 16,
            "patch_size": 8,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
        },
    )
    model = transformers.Siglip2Model(config).eval()
    model.save_pretrained(ckpt)
    (ckpt / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3,
                "resample": 2,
                "patch_size": 8,
                "max_num_patches": 16,
            }
        )
    )
    out = tmp_path / "model"
    export_hf_checkpoint(ckpt, out, precisions=["fp32"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["visual"]["image_size"] == 32 and manifest["visual"]["resize_mode"] == "squash"
    assert (
        manifest["visual"]["interpolation"] == "bilinear"
        and manifest["textual"]["clean"] == "lower"
    )
    p = start(out)
    assert p.is_ready()
    chw = np.stack([p.preprocess(i) for i in IMAGES])
    # The processor's convert_image_to_patches, restated: (C, H, W) -> (rows*cols, p*p*C).
    patches = chw.reshape(3, 3, 4, 8, 4, 8).transpose(0, 2, 4, 3, 5, 1).reshape(3, 16, 192)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.enable_truncation(16)
    tok.enable_padding(length=16, pad_id=1, pad_token="</s>")
    import ftfy

    lowered = [
        " ".join(html.unescape(html.unescape(ftfy.fix_text(t))).strip().split()).lower()
        for t in TEXTS
    ]
    ids = [e.ids for e in tok.encode_batch(lowered)]
    with torch.no_grad():
        ref_img = model.get_image_features(
            pixel_values=torch.from_numpy(patches),
            pixel_attention_mask=torch.ones(3, 16, dtype=torch.int64),
            spatial_shapes=torch.tensor([[4, 4]] * 3),
        ).pooler_output.numpy()
        ref_txt = model.get_text_features(input_ids=torch.tensor(ids)).pooler_output.numpy()
    got_img = np.stack([r.embedding for r in p.generate_embedding_batch(IMAGES)])
    got_txt = np.stack([r.embedding for r in p.generate_text_embedding_batch(TEXTS)])
    assert cosines(got_img, ref_img).min() >= 0.99999
    assert cosines(got_txt, ref_txt).min() >= 0.99999


def test_verify_proves_each_family_export(
    siglip: tuple[Path, Path], masked: tuple[str, Path, Path]
) -> None:
    from themis_clip.export.verify import verify_model

    for ckpt, out in (siglip, masked[1:]):
        rows = verify_model(out, ckpt)
        assert rows and all(r.ok for r in rows), [(r.modality, r.min_cosine) for r in rows]
        assert min(r.min_cosine for r in rows) >= 0.99999


def test_int8_and_fp16_variants_for_a_masked_and_a_padded_family(
    siglip: tuple[Path, Path], masked: tuple[str, Path, Path], tmp_path: Path
) -> None:
    """Variants "as today" for the new families: int8 calibration feeds each text tower as it
    runs (SigLIP padded to the context, BERT/XLM-R with their mask)."""
    for name, (ckpt, _) in (("siglip", siglip), (masked[0], masked[1:])):
        out = tmp_path / name
        export_hf_checkpoint(ckpt, out, precisions=["fp32", "fp16", "int8"])
        fp32 = start(out)
        ref = np.stack([r.embedding for r in fp32.generate_text_embedding_batch(TEXTS)])
        for variant in ("fp16", "int8"):
            p = OnnxClipPlugin()
            assert p.initialize(
                PluginConfig.from_dict({"model": {"path": str(out), "variant": variant}})
            ), p.last_error
            got = np.stack([r.embedding for r in p.generate_text_embedding_batch(TEXTS)])
            assert cosines(got, ref).min() >= 0.99, (name, variant, cosines(got, ref))
