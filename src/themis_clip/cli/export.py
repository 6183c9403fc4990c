"""``export`` and ``verify``: checkpoints to model directories, proven against PyTorch."""

from __future__ import annotations

import argparse
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


def _export_modules() -> tuple[Any, Any]:
    try:
        from themis_clip.export import hf, verify
    except ImportError as exc:
        raise CLIError(
            f"exporting needs the export extra ({exc.name} is missing): "
            "pip install 'themis-onnx-clip[export]'"
        ) from exc
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
            report = export_openclip(
                checkpoint, args.open_clip, Path(args.tokenizer), out, **options
            )
        else:
            if not (checkpoint / "config.json").is_file():
                raise CLIError(
                    f"{checkpoint} is not a transformers checkpoint folder (no config.json)"
                )
            report = hf.export_hf_checkpoint(checkpoint, out, **options)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    print(f"exported {report.name}: {report.embedding_dim}-d, {report.image_size} px -> {out}")
    for name, size in report.files.items():
        print(f"  {name:28} {size / 2**20:9.2f} MiB")
    print("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report.seconds.items()))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    _, verify = _export_modules()
    rows = verify.verify_model(Path(args.model_dir), Path(args.reference))
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
