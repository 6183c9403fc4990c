"""``export`` and ``verify``: checkpoints to model directories, proven against PyTorch."""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from themis_clip.cli.common import CLIError


def register(sub: Any) -> None:
    p = sub.add_parser("export", help="export a transformers CLIP checkpoint to a model directory")
    p.add_argument(
        "checkpoint",
        help="transformers CLIP/SigLIP/SigLIP 2/Chinese-CLIP/AltCLIP folder, "
        "or an open_clip/OpenAI .pt with --open-clip",
    )
    p.add_argument("out", help="model directory to write")
    p.add_argument(
        "--precision",
        default="fp32",
        help="comma-separated: fp32,fp16,int8 (static, batch-independent),int8-dynamic",
    )
    p.add_argument(
        "--calibration",
        metavar="DIR",
        help="images to calibrate int8 on (default: a built-in synthetic set, with a warning)",
    )
    p.add_argument("--name", help="model name in the manifest (default: the checkpoint folder)")
    p.add_argument(
        "--open-clip", metavar="ARCH", help="checkpoint is open_clip's, e.g. ViT-B-32-quickgelu"
    )
    p.add_argument(
        "--tokenizer",
        help="for --open-clip: a tokenizer.json, or OpenAI's bpe_simple_vocab_16e6.txt.gz "
        "(as the clip/open_clip packages ship it; converted)",
    )
    p.add_argument(
        "--external-data-threshold-mb",
        type=float,
        default=2048,
        help="store weights in <file>.data above this size (default 2048)",
    )
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("verify", help="compare an exported model with its PyTorch checkpoint")
    p.add_argument("model_dir")
    p.add_argument("--reference", required=True, help="the transformers checkpoint it came from")
    p.set_defaults(func=_cmd_verify)


# Known-harmless noise of an export (each seen on every run; nothing the user can act on):
# torch's exporter skipping torchvision ops we never use, the float() of the learned logit
# scale, and ONNX Runtime's quantiser suggesting a pre-processing step we do not need.
_HARMLESS_LOG = (
    ("torch.onnx._internal.exporter._registration", "torchvision is not installed"),
    ("", "Please consider to run pre-processing before quantization"),
    ("", "Please consider pre-processing before quantization"),
)
_HARMLESS_WARNINGS = (
    "Converting a tensor with requires_grad=True to a scalar",
    ".*requires torchvision \\(not installed\\); falling back",
)


class _DropMessage(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


@contextmanager
def _quiet_known_noise() -> Iterator[None]:
    """Silence the harmless warnings above (by logger and message); every other stays."""
    filters = [(logging.getLogger(name), _DropMessage(start)) for name, start in _HARMLESS_LOG]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        with warnings.catch_warnings():
            for message in _HARMLESS_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)


def _export_modules() -> tuple[Any, Any]:
    # A missing export extra: one message naming the command, at the CLI edge (cli/extras.py).
    from themis_clip.export import hf, verify

    return hf, verify


def _cmd_export(args: argparse.Namespace) -> int:
    hf, _ = _export_modules()
    checkpoint, out = Path(args.checkpoint), Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise CLIError(f"{out} exists and is not empty")
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    if args.calibration and not Path(args.calibration).is_dir():
        raise CLIError(f"--calibration {args.calibration}: not a folder")
    options: dict[str, Any] = {
        "calibration": Path(args.calibration) if args.calibration else None,
        "precisions": precisions,
        "name": args.name,
        "external_data_threshold_bytes": int(args.external_data_threshold_mb * 2**20),
    }
    try:
        if args.open_clip:
            from themis_clip.export.openclip import export_openclip

            if not checkpoint.is_file():
                raise CLIError(f"{checkpoint} is not a checkpoint file")
            if not args.tokenizer or not Path(args.tokenizer).is_file():
                raise CLIError(
                    "--open-clip needs --tokenizer PATH (tokenizer.json or OpenAI's "
                    "bpe_simple_vocab_16e6.txt.gz)"
                )
            options["name"] = args.name or checkpoint.stem
            with _quiet_known_noise():
                report = export_openclip(
                    checkpoint, args.open_clip, Path(args.tokenizer), out, **options
                )
        else:
            if not (checkpoint / "config.json").is_file():
                raise CLIError(
                    f"{checkpoint} is not a transformers checkpoint folder (no config.json)"
                )
            with _quiet_known_noise():
                report = hf.export_hf_checkpoint(checkpoint, out, **options)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    print(f"exported {report.name}: {report.embedding_dim}-d, {report.image_size} px -> {out}")
    for name, size in report.files.items():
        print(f"  {name:28} {size / 2**20:9.2f} MiB")
    print("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report.seconds.items()))
    return 0


def _reference_dim(config: dict[str, Any]) -> int | None:
    """The embedding dimension a transformers ``config.json`` declares (CLIP's projection;
    SigLIP's vision width, which is its embedding), or None."""
    for value in (
        config.get("projection_dim"),
        (config.get("vision_config") or {}).get("hidden_size"),
    ):
        if isinstance(value, int):
            return value
    return None


def _check_verify_inputs(model_dir: Path, reference: Path) -> None:
    """Clear errors before any model is loaded: a missing folder, reference or mismatch."""
    manifest = model_dir / "manifest.json"
    if not manifest.is_file():
        raise CLIError(f"{model_dir} is not an exported model directory (no manifest.json)")
    config_file = reference / "config.json"
    if not config_file.is_file():
        raise CLIError(
            f"--reference {reference} is not a transformers checkpoint folder (no config.json)"
        )
    try:
        dim = json.loads(manifest.read_text("utf-8")).get("embedding_dim")
        ref_dim = _reference_dim(json.loads(config_file.read_text("utf-8")))
    except (OSError, ValueError, AttributeError) as exc:
        raise CLIError(f"cannot read {manifest} or {config_file}: {exc}") from exc
    if isinstance(dim, int) and ref_dim is not None and dim != ref_dim:
        raise CLIError(
            f"{model_dir} makes {dim}-d embeddings but the reference {reference} makes "
            f"{ref_dim}-d ones: it is not the checkpoint this model was exported from"
        )


def _cmd_verify(args: argparse.Namespace) -> int:
    _check_verify_inputs(Path(args.model_dir), Path(args.reference))
    _, verify = _export_modules()
    try:
        with _quiet_known_noise():
            rows = verify.verify_model(Path(args.model_dir), Path(args.reference))
    except (RuntimeError, ValueError, OSError) as exc:
        raise CLIError(f"cannot verify {args.model_dir}: {exc}") from exc
    header = (
        "variant",
        "modality",
        "items",
        "min cosine",
        "max |diff|",
        "needed",
        "to fp32",
        "batch-indep.",
        "ok",
    )
    print("{:12} {:8} {:>5} {:>12} {:>11} {:>8} {:>10} {:>12}  {}".format(*header))
    for r in rows:
        print(
            f"{r.variant:12} {r.modality:8} {r.items:5d} {r.min_cosine:12.7f} "
            f"{r.max_abs_diff:11.2e} {r.threshold:8.5f} {r.cosine_to_fp32:10.6f} "
            f"{'yes' if r.batch_independent else 'no':>12}  {'yes' if r.ok else 'NO'}"
        )
    return 0 if all(r.ok for r in rows) else 1
