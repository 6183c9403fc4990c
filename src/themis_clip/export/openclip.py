"""open_clip / OpenAI CLIP checkpoints (ViT towers) → a transformers ``CLIPModel`` → our exporter.

The ``open_clip`` package cannot be imported beside this project's torch (it needs torchvision),
so the checkpoint is read directly. An OpenAI-architecture state dict (``visual.conv1.weight``,
``visual.transformer.resblocks.N.*``, ``token_embedding.weight``, ``text_projection``, ...)
determines the whole architecture through its tensor shapes, exactly as OpenAI's
``build_model(state_dict)`` reads it: widths, layer counts, patch and image size, context length,
vocabulary and embedding dimension. Heads are ``width // 64`` (the convention of every OpenAI and
open_clip ViT config). What shapes cannot tell is the activation: OpenAI's weights and open_clip's
``-quickgelu`` architectures use QuickGELU, the other open_clip architectures GELU; it follows
from the architecture name.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from themis_clip.errors import ExportError

__all__ = ["OPEN_CLIP_ARCHITECTURES", "hf_state_dict", "load_openclip_as_hf", "to_hf_checkpoint"]

#: Architectures this converter knows (ViT towers); the ``-quickgelu`` ones use QuickGELU.
OPEN_CLIP_ARCHITECTURES = (
    "ViT-B-32",
    "ViT-B-32-quickgelu",
    "ViT-B-16",
    "ViT-B-16-quickgelu",
    "ViT-L-14",
    "ViT-L-14-quickgelu",
    "ViT-L-14-336",
    "ViT-L-14-336-quickgelu",
    "ViT-H-14",
    "ViT-g-14",
    "ViT-bigG-14",
    "openai",
)


def _activation(architecture: str) -> str:
    if architecture not in OPEN_CLIP_ARCHITECTURES:
        known = ", ".join(OPEN_CLIP_ARCHITECTURES)
        raise ExportError(
            f"unknown open_clip architecture {architecture!r} (ViT towers only): {known}"
        )
    return (
        "quick_gelu" if architecture == "openai" or architecture.endswith("-quickgelu") else "gelu"
    )


def _load_state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(str(checkpoint), map_location="cpu", weights_only=True)
    except Exception:  # OpenAI's own files are TorchScript archives
        obj = torch.jit.load(str(checkpoint), map_location="cpu").state_dict()
    if isinstance(obj, dict) and "state_dict" in obj:
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ExportError(f"{checkpoint} holds no state dict")
    return {re.sub(r"^module\.", "", k): v for k, v in obj.items()}


def _layers(sd: dict[str, torch.Tensor], prefix: str) -> int:
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)\.")
    return 1 + max(int(m.group(1)) for k in sd if (m := pattern.match(k)))


def hf_config(sd: dict[str, torch.Tensor], activation: str) -> dict[str, Any]:
    """transformers ``CLIPConfig`` keyword arguments read off the state dict's shapes."""
    if "visual.conv1.weight" not in sd or "visual.proj" not in sd:
        raise ExportError(
            "not an OpenAI-architecture ViT CLIP state dict (no visual.conv1 / visual.proj); "
            "ModifiedResNet towers are not supported"
        )
    v_width, _, patch, _ = sd["visual.conv1.weight"].shape
    grid = round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    t_width = sd["ln_final.weight"].shape[0]
    vocab = sd["token_embedding.weight"].shape[0]
    return {
        "projection_dim": int(sd["text_projection"].shape[1]),
        "logit_scale_init_value": float(sd["logit_scale"]) if "logit_scale" in sd else 2.6592,
        "vision_config": {
            "hidden_size": int(v_width),
            "intermediate_size": int(sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
            "num_hidden_layers": _layers(sd, "visual.transformer.resblocks."),
            "num_attention_heads": int(v_width) // 64 or 1,
            "image_size": int(patch * grid),
            "patch_size": int(patch),
            "hidden_act": activation,
            "layer_norm_eps": 1e-5,
        },
        "text_config": {
            "vocab_size": int(vocab),
            "hidden_size": int(t_width),
            "intermediate_size": int(sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
            "num_hidden_layers": _layers(sd, "transformer.resblocks."),
            "num_attention_heads": int(t_width) // 64 or 1,
            "max_position_embeddings": int(sd["positional_embedding"].shape[0]),
            "hidden_act": activation,
            "layer_norm_eps": 1e-5,
            "bos_token_id": int(vocab) - 2,
            "eos_token_id": int(vocab) - 1,
            "pad_token_id": int(vocab) - 1,
        },
    }


def _block(sd: dict[str, torch.Tensor], src: str, dst: str, out: dict[str, torch.Tensor]) -> None:
    q, k, v = sd[f"{src}.attn.in_proj_weight"].chunk(3)
    qb, kb, vb = sd[f"{src}.attn.in_proj_bias"].chunk(3)
    for name, w, b in (("q_proj", q, qb), ("k_proj", k, kb), ("v_proj", v, vb)):
        out[f"{dst}.self_attn.{name}.weight"], out[f"{dst}.self_attn.{name}.bias"] = w, b
    pairs = {
        "attn.out_proj": "self_attn.out_proj",
        "ln_1": "layer_norm1",
        "ln_2": "layer_norm2",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
    }
    for ours, theirs in pairs.items():
        out[f"{dst}.{theirs}.weight"] = sd[f"{src}.{ours}.weight"]
        out[f"{dst}.{theirs}.bias"] = sd[f"{src}.{ours}.bias"]


def hf_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The transformers ``CLIPModel`` state dict holding the same weights."""
    out: dict[str, torch.Tensor] = {
        "vision_model.embeddings.class_embedding": sd["visual.class_embedding"],
        "vision_model.embeddings.patch_embedding.weight": sd["visual.conv1.weight"],
        "vision_model.embeddings.position_embedding.weight": sd["visual.positional_embedding"],
        "vision_model.pre_layrnorm.weight": sd["visual.ln_pre.weight"],
        "vision_model.pre_layrnorm.bias": sd["visual.ln_pre.bias"],
        "vision_model.post_layernorm.weight": sd["visual.ln_post.weight"],
        "vision_model.post_layernorm.bias": sd["visual.ln_post.bias"],
        "visual_projection.weight": sd["visual.proj"].T.contiguous(),
        "text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
        "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
        "text_model.final_layer_norm.weight": sd["ln_final.weight"],
        "text_model.final_layer_norm.bias": sd["ln_final.bias"],
        "text_projection.weight": sd["text_projection"].T.contiguous(),
    }
    if "logit_scale" in sd:
        out["logit_scale"] = sd["logit_scale"].reshape(())
    for i in range(_layers(sd, "visual.transformer.resblocks.")):
        _block(sd, f"visual.transformer.resblocks.{i}", f"vision_model.encoder.layers.{i}", out)
    for i in range(_layers(sd, "transformer.resblocks.")):
        _block(sd, f"transformer.resblocks.{i}", f"text_model.encoder.layers.{i}", out)
    return out


def load_openclip_as_hf(checkpoint: Path, architecture: str) -> Any:
    """The checkpoint as a transformers ``CLIPModel`` (eval mode), every weight accounted for."""
    from transformers import CLIPConfig, CLIPModel

    sd = _load_state_dict(checkpoint)
    model = CLIPModel(CLIPConfig(**hf_config(sd, _activation(architecture)))).eval()
    weights = hf_state_dict(sd)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not m.endswith("position_ids")]
    if missing or unexpected:
        raise ExportError(
            f"checkpoint does not fit the architecture: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    return model


def to_hf_checkpoint(
    checkpoint: Path, architecture: str, tokenizer_json: Path, out_dir: Path
) -> Path:
    """Write a transformers checkpoint folder (weights, tokenizer, preprocessor) to export.

    ``tokenizer_json`` is a ``tokenizer.json`` or OpenAI's BPE merges file (``.txt``/``.gz``),
    converted with :func:`~themis_clip.export.tokenizer.openai_bpe_tokenizer`.
    """
    import shutil

    from themis_clip.export.hf import save_image_processor
    from themis_clip.export.tokenizer import openai_bpe_tokenizer, read_tokenizer

    model = load_openclip_as_hf(checkpoint, architecture)
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_json.suffix == ".json":
        size = read_tokenizer(tokenizer_json).get_vocab_size()
        shutil.copy(tokenizer_json, out_dir / "tokenizer.json")
    else:  # OpenAI's merges file (bpe_simple_vocab_16e6.txt.gz), as the clip packages ship it
        size = openai_bpe_tokenizer(tokenizer_json, out_dir / "tokenizer.json").get_vocab_size()
    if size > model.config.text_config.vocab_size:
        raise ExportError(
            f"tokenizer {tokenizer_json.name} has {size} tokens but the checkpoint's token "
            f"embedding has {model.config.text_config.vocab_size} rows"
        )
    model.save_pretrained(str(out_dir))
    save_image_processor(out_dir, model.config.vision_config.image_size)
    (out_dir / "tokenizer_config.json").write_text('{"pad_token": "<|endoftext|>"}')
    return out_dir


def export_openclip(
    checkpoint: Path, architecture: str, tokenizer_json: Path, out: Path, **kwargs: Any
) -> Any:
    """Convert and export in one step (see :func:`themis_clip.export.hf.export_hf_checkpoint`)."""
    from themis_clip.export.hf import export_hf_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = to_hf_checkpoint(
            checkpoint, architecture, tokenizer_json, Path(tmp) / checkpoint.stem
        )
        return export_hf_checkpoint(hf_dir, out, **kwargs)
