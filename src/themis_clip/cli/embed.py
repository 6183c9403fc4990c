"""``embed``, ``info``, ``health``: embed files or texts; describe and check the model."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from themis_clip.cli.common import CLIError, model_args, shown, stamp_of, start_plugin
from themis_clip.errors import TextInputError
from themis_clip.files import walk_images
from themis_clip.interface import EmbeddingResult
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.preprocess.text import check_language

_OUTPUT_SUFFIXES = (".npy", ".jsonl")


def register(sub: Any) -> None:
    p = sub.add_parser("embed", help="embed image files (or texts with --text)")
    p.add_argument("files", nargs="*", help="image files or folders (searched recursively)")
    p.add_argument("--text", action="append", default=[], help="a text to embed (repeatable)")
    p.add_argument(
        "--language", help="Flores-200 code (eng_Latn) for models that take a language prefix"
    )
    p.add_argument(
        "-o", "--output", help="write .npy (matrix) or .jsonl; default: JSON lines on stdout"
    )
    model_args(p)
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser("info", help="describe the plugin and the model")
    model_args(p)
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("health", help="load the model and run the health check")
    model_args(p)
    p.set_defaults(func=_cmd_health)


def _cmd_embed(args: argparse.Namespace) -> int:
    if not args.files and not args.text:
        raise CLIError("nothing to embed: give image files/folders or --text")
    if args.output and Path(args.output).suffix.lower() not in _OUTPUT_SUFFIXES:
        raise CLIError(
            f"-o {args.output}: unknown format {Path(args.output).suffix or '(no suffix)'!r}; "
            "write .npy (a matrix) or .jsonl (JSON lines)"
        )
    if args.language is not None:
        try:
            check_language(args.language)
        except TextInputError as exc:
            raise CLIError(f"--language: {exc}") from exc
    files = list(_expand(args.files))
    if args.files and not files:
        raise CLIError("no image files found in the given paths")
    plugin = start_plugin(args)
    if (
        args.language is not None
        and args.text
        and not (plugin.model_spec and plugin.model_spec.text.takes_language)
    ):
        print(
            f"themis-clip: warning: --language {args.language} is ignored: "
            f"{stamp_of(plugin).name} takes no language code",
            file=sys.stderr,
        )
    try:
        names: list[str] = []
        results: list[EmbeddingResult] = []
        if files:
            names += [str(f) for f in files]
            results += _embed_files(plugin, files)
        if args.text:
            names += args.text
            results += plugin.generate_text_embedding_batch(args.text, args.language)
        dim = stamp_of(plugin).embedding_dim  # a matrix of failed rows is still D wide
        is_text = [False] * len(files) + [True] * len(args.text)
        _write(names, results, args.output, dim=dim, is_text=is_text)
    finally:
        plugin.shutdown()
    failed = [(n, r) for n, r in zip(names, results, strict=True) if not r.ok]
    for name, r in failed:
        print(f"themis-clip: {shown(name)}: {shown(str(r.error))}", file=sys.stderr)
    return 1 if failed else 0


def _cmd_info(args: argparse.Namespace) -> int:
    plugin = start_plugin(args)
    try:
        info = plugin.get_info()
        stats = plugin.get_statistics()
        out = {
            "plugin": {
                "name": info.name,
                "version": info.version,
                "description": info.description,
                "capabilities": list(info.capabilities),
            },
            "model": {
                k: stats[k]
                for k in (
                    "model_variant",
                    "model_id",
                    "model_sha256",
                    "precision_variant",
                    "embedding_dim",
                    "image_size",
                    "text_tower",
                )
            },
            "backend": stats["backend"],
            "providers": stats["providers"],
            "precision": stats["precision"],
            "canary": stats["canary"],
            "loading_mode": stats["loading_mode"],
        }
        print(json.dumps(out, indent=2))
    finally:
        plugin.shutdown()
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    plugin = start_plugin(args)
    try:
        ok = plugin.health_check()
        stats = plugin.get_statistics()
        print(
            json.dumps(
                {
                    "healthy": ok,
                    "model_id": stats["model_id"],
                    "backend": stats["backend"],
                    "precision": stats["precision"],
                    "precision_variant": stats["precision_variant"],
                }
            )
        )
    finally:
        plugin.shutdown()
    return 0 if ok else 1


def _expand(paths: Sequence[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from walk_images(path)  # the indexer's walker: hidden folders skipped
        else:
            yield path  # a missing or bad file becomes a per-item error, not an abort


def _embed_files(plugin: OnnxClipPlugin, files: Sequence[Path]) -> list[EmbeddingResult]:
    from tqdm import tqdm  # type: ignore[import-untyped]

    config = plugin.config
    step = 4 * (config.max_batch_size if config else 32)
    results: list[EmbeddingResult] = []
    with tqdm(
        total=len(files), unit="img", disable=len(files) <= step or None, file=sys.stderr
    ) as bar:
        for start in range(0, len(files), step):
            chunk = files[start : start + step]
            results += plugin.generate_embedding_batch(chunk)
            bar.update(len(chunk))
    return results


def _write(
    names: list[str],
    results: list[EmbeddingResult],
    output: str | None,
    *,
    dim: int,
    is_text: list[bool],
) -> None:
    if output and output.lower().endswith(".npy"):
        matrix = np.full((len(results), dim), np.nan, dtype=np.float32)
        for i, r in enumerate(results):
            if r.embedding is not None:
                matrix[i] = r.embedding
        np.save(output, matrix)
        Path(output).with_suffix(".json").write_text(
            json.dumps(
                [
                    {"input": n, "ok": r.ok, "error": r.error}
                    for n, r in zip(names, results, strict=True)
                ],
                indent=1,
            )
        )
        print(
            f"wrote {matrix.shape[0]}x{dim} embeddings to {output} (failed rows are NaN)",
            file=sys.stderr,
        )
        return
    stream: TextIO
    with open(output, "w", encoding="utf-8") if output else _nullcontext(sys.stdout) as stream:
        for name, r, text in zip(names, results, is_text, strict=True):
            row: dict[str, Any] = {"text" if text else "path": name, "ok": r.ok}
            if r.ok and r.embedding is not None:
                row["embedding"] = [round(float(v), 7) for v in r.embedding]
                row["model_id"] = r.model_id
                if text:
                    row["truncated"] = r.truncated
            else:
                row["error"] = r.error
            stream.write(json.dumps(row) + "\n")


class _nullcontext:  # noqa: N801 - mirrors contextlib.nullcontext, typed for TextIO
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __enter__(self) -> TextIO:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        return None
