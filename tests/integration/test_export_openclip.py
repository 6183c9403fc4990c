"""open_clip / OpenAI-architecture checkpoints, checked against an independent reference (slow)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from tests.helpers import photo_like  # noqa: E402
from themis_clip import OnnxClipPlugin, PluginConfig  # noqa: E402
from themis_clip.export.tokenizer import (  # noqa: E402
    build_clip_tokenizer,
    openai_bpe_tokenizer,
)

pytestmark = pytest.mark.slow


# -- OpenAI CLIP's architecture (model.py), restated in plain torch as the reference --------------


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads)
        self.ln_1 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(
                [
                    ("c_fc", nn.Linear(width, width * 4)),
                    ("gelu", QuickGELU()),
                    ("c_proj", nn.Linear(width * 4, width)),
                ]
            )
        )
        self.ln_2 = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.resblocks = nn.ModuleList(ResidualAttentionBlock(width, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.resblocks:
            x = block(x, mask)
        return x


class VisionTransformer(nn.Module):
    def __init__(self, size: int, patch: int, width: int, layers: int, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, patch, patch, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(width) * width**-0.5)
        self.positional_embedding = nn.Parameter(
            torch.randn((size // patch) ** 2 + 1, width) * width**-0.5
        )
        self.ln_pre = nn.LayerNorm(width)
        self.transformer = Transformer(width, layers, width // 64)
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(torch.randn(width, dim) * width**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x).flatten(2).permute(0, 2, 1)
        cls = self.class_embedding.expand(x.shape[0], 1, -1)
        x = self.ln_pre(torch.cat([cls, x], dim=1) + self.positional_embedding)
        x = self.transformer(x.permute(1, 0, 2)).permute(1, 0, 2)
        return self.ln_post(x[:, 0, :]) @ self.proj


class CLIP(nn.Module):
    def __init__(self, vocab: int, ctx: int = 77, width: int = 128, dim: int = 32) -> None:
        super().__init__()
        self.visual = VisionTransformer(32, 8, 128, 2, dim)
        self.transformer = Transformer(width, 2, width // 64)
        self.token_embedding = nn.Embedding(vocab, width)
        self.positional_embedding = nn.Parameter(torch.randn(ctx, width) * 0.01)
        self.ln_final = nn.LayerNorm(width)
        self.text_projection = nn.Parameter(torch.randn(width, dim) * width**-0.5)
        self.logit_scale = nn.Parameter(torch.tensor(4.6052))
        mask = torch.full((ctx, ctx), float("-inf")).triu_(1)
        self.register_buffer("attn_mask", mask, persistent=False)

    def encode_text(self, text: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(text) + self.positional_embedding
        x = self.transformer(x.permute(1, 0, 2), self.attn_mask).permute(1, 0, 2)
        x = self.ln_final(x)
        return x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.text_projection


@pytest.mark.parametrize("tokenizer_kind", ["tokenizer.json", "openai-merges"])
def test_open_clip_checkpoint_export_matches_the_reference(
    tmp_path: Path, tokenizer_kind: str
) -> None:
    build_clip_tokenizer(tmp_path / "tokenizer.json")
    tokenizer_arg = tmp_path / "tokenizer.json"
    if tokenizer_kind == "openai-merges":  # the file the clip/open_clip packages ship
        merges = json.loads(tokenizer_arg.read_text())["model"]["merges"]
        lines = [m if isinstance(m, str) else " ".join(m) for m in merges]
        tokenizer_arg = tmp_path / "bpe_simple_vocab_test.txt.gz"
        tokenizer_arg.write_bytes(gzip.compress(("#version: 0.2\n" + "\n".join(lines)).encode()))
        openai_bpe_tokenizer(tokenizer_arg, tmp_path / "converted.json")
    from themis_clip.preprocess.text import CLIPTokenizer

    tok = CLIPTokenizer(
        tmp_path / ("tokenizer.json" if tokenizer_kind == "tokenizer.json" else "converted.json")
    )
    assert tok.eot_id == max(tok.sot_id, tok.eot_id)  # OpenAI pools at argmax: EOT is the top id
    torch.manual_seed(0)
    reference = CLIP(vocab=tok.eot_id + 1).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters, so a swapped mapping would show
        for name, p in reference.named_parameters():
            if name.endswith(
                ("ln_1.weight", "ln_2.weight", "ln_pre.weight", "ln_post.weight", "ln_final.weight")
            ):
                p.add_(torch.randn_like(p) * 0.2)
    torch.save(reference.state_dict(), tmp_path / "openai-tiny.pt")
    exe = str(Path(sys.executable).parent / "themis-clip")
    out = tmp_path / "model"
    run = subprocess.run(
        [
            exe,
            "export",
            str(tmp_path / "openai-tiny.pt"),
            str(out),
            "--open-clip",
            "openai",
            "--tokenizer",
            str(tokenizer_arg),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    plugin = OnnxClipPlugin()
    assert plugin.initialize(PluginConfig.from_dict({"model": {"path": str(out)}}))
    images = [photo_like(50 + 10 * i, 40, i) for i in range(4)]
    assert plugin.get_statistics()["text_tower"]
    pixels = torch.from_numpy(np.stack([plugin.preprocess(i) for i in images]))
    texts = ["a red circle", "a small blue square on the left", ""]
    rows = plugin.tokenize(texts)
    ids = torch.zeros((len(rows), 77), dtype=torch.int64)  # OpenAI pads with 0 to 77
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    with torch.no_grad():
        ref_img = torch.nn.functional.normalize(reference.visual(pixels), dim=-1).numpy()
        ref_txt = torch.nn.functional.normalize(reference.encode_text(ids), dim=-1).numpy()
    got_img = np.stack([r.embedding for r in plugin.generate_embedding_batch(images)])
    got_txt = np.stack([r.embedding for r in plugin.generate_text_embedding_batch(texts)])
    assert np.abs(got_img - ref_img).max() < 1e-5
    assert np.abs(got_txt - ref_txt).max() < 1e-5
    plugin.shutdown()


def test_unknown_architecture_and_missing_tokenizer(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "themis-clip")
    (tmp_path / "x.pt").write_bytes(b"")
    run = subprocess.run(
        [exe, "export", str(tmp_path / "x.pt"), str(tmp_path / "o"), "--open-clip", "RN50"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "--tokenizer" in run.stderr
    build_clip_tokenizer(tmp_path / "t.json")
    torch.save({"foo": torch.zeros(1)}, tmp_path / "y.pt")
    run = subprocess.run(
        [
            exe,
            "export",
            str(tmp_path / "y.pt"),
            str(tmp_path / "o2"),
            "--open-clip",
            "RN50",
            "--tokenizer",
            str(tmp_path / "t.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "unknown open_clip architecture 'RN50'" in run.stderr


def test_tokenizer_that_does_not_fit_the_checkpoint_is_refused(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "themis-clip")
    build_clip_tokenizer(tmp_path / "tokenizer.json")  # ~600 tokens
    torch.manual_seed(0)
    torch.save(CLIP(vocab=100).state_dict(), tmp_path / "small-vocab.pt")
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    for tokenizer, message in (
        (tmp_path / "tokenizer.json", "token embedding has 100 rows"),
        (bad, "is not a tokenizer.json"),
    ):
        run = subprocess.run(
            [
                exe,
                "export",
                str(tmp_path / "small-vocab.pt"),
                str(tmp_path / "out"),
                "--open-clip",
                "openai",
                "--tokenizer",
                str(tokenizer),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 2 and message in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
