"""``themis-clip``: a thin command line over the library (parse, call, print).

Exit codes: 0 success; 1 some inputs failed (results for the rest are still written);
2 usage, configuration or model errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from themis_clip._version import __version__
from themis_clip.config import ModelConfig, PluginConfig
from themis_clip.errors import ThemisClipError
from themis_clip.index.indexer import IMAGE_SUFFIXES, IndexReport, index_folder
from themis_clip.index.search import Hit, ModelStamp, VectorIndex
from themis_clip.interface import BackendType, EmbeddingResult
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.resources import demo_model_path

__all__ = ["main"]

DEFAULT_INDEX = "themis-index.db"


class CLIError(Exception):
    """A usage or set-up problem: message to stderr, exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (``themis-clip`` calls ``sys.exit`` on it)."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
        return code
    except (CLIError, ThemisClipError) as exc:
        print(f"themis-clip: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("themis-clip: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="themis-clip", description="CLIP embeddings on ONNX Runtime"
    )
    parser.add_argument("--version", action="version", version=f"themis-clip {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log lifecycle events")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model", help="model directory or image-tower .onnx (default: the shipped demo model)"
        )
        p.add_argument("--config", help="JSON config file (the seed's format)")
        p.add_argument(
            "--backend", choices=[b.value for b in BackendType], help="execution backend"
        )
        p.add_argument("--batch-size", type=int, help="max_batch_size")

    p = sub.add_parser("embed", help="embed image files (or texts with --text)")
    p.add_argument("files", nargs="*", help="image files or folders (searched recursively)")
    p.add_argument("--text", action="append", default=[], help="a text to embed (repeatable)")
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

    p = sub.add_parser("index", help="index the images under a folder (incremental, resumable)")
    p.add_argument("folder")
    p.add_argument("--index", default=DEFAULT_INDEX, help=f"index file (default {DEFAULT_INDEX})")
    p.add_argument("--rebuild", action="store_true", help="delete the index first")
    p.add_argument(
        "--from-parquet", action="store_true", help="FOLDER holds embed-dataset Parquet output"
    )
    model_args(p)
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser("embed-dataset", help="embed a large collection on Ray into Parquet")
    p.add_argument(
        "input", help="a folder, a glob, or a .parquet/.csv listing with a 'path' column"
    )
    p.add_argument("output", help="folder of Parquet files (re-runs skip what it holds)")
    p.add_argument(
        "--ray-address", help="local (default), auto, or ray://host:port; or RAY_ADDRESS"
    )
    p.add_argument("--actors", type=int, default=1, help="actor pool size, one plugin each")
    p.add_argument("--gpus-per-actor", type=float, default=0.0)
    model_args(p)
    p.set_defaults(func=_cmd_embed_dataset)

    p = sub.add_parser("search", help="search an index by text or by image")
    p.add_argument("query", nargs="?", help="text query")
    p.add_argument("--image", help="image file query (image -> image)")
    p.add_argument("-k", type=int, default=10, help="number of results (default 10)")
    p.add_argument("--filter", action="append", default=[], help="metadata KEY=VALUE (JSON value)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--index", default=DEFAULT_INDEX, help=f"index file (default {DEFAULT_INDEX})")
    model_args(p)
    p.set_defaults(func=_cmd_search)

    p = sub.add_parser("serve", help="run the HTTP service")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    p.add_argument("--index", help="index file for /search and /index/items")
    p.add_argument("--model-root", help="folder that /admin/reload model paths must stay inside")
    p.add_argument("--max-queue", type=int, default=512, help="waiting items before 429")
    p.add_argument("--max-queue-delay-ms", type=float, default=5.0, help="batch fill wait")
    p.add_argument("--request-timeout-s", type=float, default=30.0, help="504 beyond this")
    p.add_argument("--max-body-mb", type=float, default=20.0, help="413 beyond this")
    p.add_argument("--no-warmup", action="store_true", help="ready without warming up")
    model_args(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("export", help="export a transformers CLIP checkpoint to a model directory")
    p.add_argument(
        "checkpoint",
        help="transformers CLIPModel folder, or an open_clip/OpenAI .pt with --open-clip",
    )
    p.add_argument("out", help="model directory to write")
    p.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,int8")
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

    p = sub.add_parser(
        "demo", help="the main job on the embedded defaults: embed a generated gallery"
    )
    p.add_argument(
        "--gallery", default=".cache/demo-gallery", help="where to write the generated images"
    )
    p.add_argument("--count", type=int, default=60, help="number of gallery images")
    model_args(p)
    p.set_defaults(func=_cmd_demo)
    return parser


# -- commands ----------------------------------------------------------------------------------


def _cmd_embed(args: argparse.Namespace) -> int:
    if not args.files and not args.text:
        raise CLIError("nothing to embed: give image files/folders or --text")
    files = list(_expand(args.files))
    if args.files and not files:
        raise CLIError("no image files found in the given paths")
    plugin = _start(args)
    try:
        names: list[str] = []
        results: list[EmbeddingResult] = []
        if files:
            names += [str(f) for f in files]
            results += _embed_files(plugin, files)
        if args.text:
            names += args.text
            results += plugin.generate_text_embedding_batch(args.text)
        _write(names, results, args.output, is_text=[False] * len(files) + [True] * len(args.text))
    finally:
        plugin.shutdown()
    failed = [(n, r) for n, r in zip(names, results, strict=True) if not r.ok]
    for name, r in failed:
        print(f"themis-clip: {name}: {r.error}", file=sys.stderr)
    return 1 if failed else 0


def _cmd_info(args: argparse.Namespace) -> int:
    plugin = _start(args)
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
            "loading_mode": stats["loading_mode"],
        }
        print(json.dumps(out, indent=2))
    finally:
        plugin.shutdown()
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    plugin = _start(args)
    try:
        ok = plugin.health_check()
        stats = plugin.get_statistics()
        print(
            json.dumps({"healthy": ok, "model_id": stats["model_id"], "backend": stats["backend"]})
        )
    finally:
        plugin.shutdown()
    return 0 if ok else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from themis_clip.server import ServerSettings, create_app
    except ImportError as exc:
        raise CLIError(
            f"serving needs the server extra ({exc.name} is missing): "
            "pip install 'themis-onnx-clip[server]'"
        ) from exc
    for name in ("max_queue", "max_queue_delay_ms", "request_timeout_s", "max_body_mb"):
        if getattr(args, name) <= 0:
            raise CLIError(f"--{name.replace('_', '-')} must be > 0")
    settings = ServerSettings(
        plugin_config=_config(args),
        index_path=args.index,
        model_root=args.model_root,
        admin_token=os.environ.get("THEMIS_ADMIN_TOKEN") or None,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_queue=args.max_queue,
        max_queue_delay_ms=args.max_queue_delay_ms,
        request_timeout_s=args.request_timeout_s,
        warmup=not args.no_warmup,
    )
    # uvicorn drains in-flight requests on SIGTERM, restores the previous handler and re-raises
    # the signal; a no-op handler makes that graceful stop end with exit code 0, not -15.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # Bind here, so that --port 0 picks a free port and the line below says which (tests and
    # supervisors read it; nothing races for a port between choosing and binding it).
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            log_level="info" if args.verbose else "warning",
            timeout_graceful_shutdown=int(args.request_timeout_s) + 5,
        )
    )
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    print(f"themis-clip: listening on http://{host}:{sock.getsockname()[1]}", file=sys.stderr)
    sys.stderr.flush()
    server.run(sockets=[sock])
    return 0


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
    options: dict[str, Any] = {
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
    header = ("variant", "modality", "items", "min cosine", "max |diff|", "needed", "ok")
    print("{:8} {:8} {:>5} {:>12} {:>11} {:>8}  {}".format(*header))
    for r in rows:
        print(
            f"{r.variant:8} {r.modality:8} {r.items:5d} {r.min_cosine:12.7f} "
            f"{r.max_abs_diff:11.2e} {r.threshold:8.5f}  {'yes' if r.ok else 'NO'}"
        )
    return 0 if all(r.ok for r in rows) else 1


def _stamp(plugin: OnnxClipPlugin) -> ModelStamp:
    identity = plugin.model_identity
    assert identity is not None
    return ModelStamp(
        model_id=identity.model_id, sha256=identity.sha256, dim=identity.embedding_dim
    )


def _print_report(report: IndexReport, index_path: str) -> None:
    print(
        f"{index_path}: {report.added} added, {report.updated} updated, "
        f"{report.unchanged} unchanged, "
        f"{report.renamed} renamed, {report.duplicates} duplicates, {report.removed} removed, "
        f"{len(report.failed)} unreadable ({report.seconds:.1f} s)"
    )
    for path, error in report.failed:
        print(f"  skipped {path}: {error}")


def _cmd_index(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        raise CLIError(f"not a folder: {folder}")
    if args.from_parquet:
        return _index_from_parquet(args, folder)
    if args.rebuild:
        _remove_index(args.index)
    plugin = _start(args)
    try:
        with VectorIndex(args.index) as index:
            report = index_folder(
                index,
                folder,
                plugin,
                stamp=_stamp(plugin),
                chunk=4 * (plugin.config.max_batch_size if plugin.config else 32),
            )
            _prepare_graph(index)
    finally:
        plugin.shutdown()
    _print_report(report, args.index)
    return 0


def _prepare_graph(index: VectorIndex) -> None:
    """Build the HNSW graph once here, so later searches (read-only) never wait for one."""
    count = index.store.count()
    if count > index.exact_threshold:
        print(f"building the HNSW search graph over {count} items ...", file=sys.stderr)
        if index.prepare_graph():
            print("HNSW graph saved", file=sys.stderr)


def _remove_index(path: str) -> None:
    for suffix in ("", "-wal", "-shm", ".usearch"):
        Path(path + suffix).unlink(missing_ok=True)


def _index_from_parquet(args: argparse.Namespace, folder: Path) -> int:
    from themis_clip.distributed import read_embeddings
    from themis_clip.index.store import ItemRow

    rows = read_embeddings(folder)
    plugin = _start(args)  # the model whose identity the index records, and must match
    try:
        stamp = _stamp(plugin)
    finally:
        plugin.shutdown()
    foreign = {m for _, m, _ in rows if m != stamp.model_id}
    if foreign:
        raise CLIError(
            f"{folder} holds embeddings of {', '.join(sorted(foreign))}, not of {stamp.model_id}: "
            "load the same model with --model, or re-embed"
        )
    if args.rebuild:
        _remove_index(args.index)
    with VectorIndex(args.index) as index:
        index.bind_model(stamp)
        items = []
        for path, _, vector in rows:
            st = Path(path).stat() if Path(path).exists() else None
            items.append(
                ItemRow(
                    key=path,
                    path=path,
                    vector=vector,
                    size=st.st_size if st else None,
                    mtime_ns=st.st_mtime_ns if st else None,
                )
            )
        for start in range(0, len(items), 10_000):
            index.store.upsert(items[start : start + 10_000], dim=stamp.dim)
        _prepare_graph(index)
        total = index.store.count()
    print(
        f"{args.index}: {len(items)} embeddings loaded from {folder} ({total} items in the index)"
    )
    return 0


def _cmd_embed_dataset(args: argparse.Namespace) -> int:
    try:
        from themis_clip.distributed import embed_dataset
    except ImportError as exc:
        raise CLIError(
            f"needs the ray extra ({exc.name} is missing): pip install 'themis-onnx-clip[ray]'"
        ) from exc
    if args.actors < 1:
        raise CLIError("--actors must be >= 1")
    config = _config(args)
    raw = config.raw()  # the whole configuration, losslessly, to every actor
    address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    try:
        report = embed_dataset(
            args.input,
            Path(args.output),
            raw,
            address=address,
            actors=args.actors,
            batch_size=config.max_batch_size,
            num_gpus_per_actor=args.gpus_per_actor,
        )
    except (ValueError, FileNotFoundError) as exc:
        raise CLIError(str(exc)) from exc
    print(
        f"{args.output}: {report.listed} listed, {report.skipped} already there, "
        f"{report.embedded} embedded, {report.failed} failed ({report.seconds:.1f} s, "
        f"{report.rate:.1f} items/s, {report.actors} actors)"
    )
    return 0


def _query_vector(plugin: OnnxClipPlugin, text: str | None, image: str | None) -> np.ndarray:
    if (text is None) == (image is None):
        raise CLIError("give either a text query or --image FILE")
    result = (
        plugin.generate_embedding(image) if image else plugin.generate_text_embedding(text or "")
    )
    if not result.ok or result.embedding is None:
        raise CLIError(f"cannot embed the query: {result.error}")
    return result.embedding


def _parse_filters(raw: list[str]) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--filter needs KEY=VALUE, got {item!r}")
        try:
            filters[key] = json.loads(value)
        except ValueError:
            filters[key] = value
    return filters


def _cmd_search(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise CLIError("-k must be >= 1")
    with VectorIndex(args.index, readonly=True) as index:
        plugin = _start(args)
        try:
            index.bind_model(_stamp(plugin))  # refuses an index made by another model
            hits = index.search(
                _query_vector(plugin, args.query, args.image),
                args.k,
                _parse_filters(args.filter) or None,
            )
        finally:
            plugin.shutdown()
    _print_hits(hits, as_json=args.json)
    return 0


def _print_hits(hits: list[Hit], *, as_json: bool = False, indent: str = "") -> None:
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "key": h.key,
                        "score": round(h.score, 6),
                        "path": h.path,
                        "metadata": h.metadata,
                    }
                    for h in hits
                ],
                indent=1,
            )
        )
        return
    if not hits:
        print(f"{indent}(no results)")
    for rank, h in enumerate(hits, 1):
        print(f"{indent}{rank:2d}. {h.score:+.3f}  {h.path or h.key}")


def _cmd_demo(args: argparse.Namespace) -> int:
    from themis_clip.demo.scenes import write_gallery

    gallery_dir = Path(args.gallery)
    gallery = write_gallery(gallery_dir, args.count)
    plugin = _start(args)
    try:
        stats = plugin.get_statistics()
        print(
            f"model {stats['model_id']} on {stats['backend']} "
            f"({stats['embedding_dim']}-d embeddings)"
        )
        if stats["model_variant"] == "themis-demo-shapes":
            print("note: the demo model knows generated shapes only; use --model for real CLIP.")
        index_path = str(gallery_dir.parent / "demo-index.db")
        with VectorIndex(index_path) as index:
            report = index_folder(index, gallery_dir, plugin, stamp=_stamp(plugin), progress=False)
            _print_report(report, index_path)
            queries = [
                "a red circle",
                "a small blue square on the left",
                "a large yellow star",
                "a green ring",
            ]
            print("\nText -> image (file names carry the truth: colour-shape-size-position):")
            for query in queries:
                print(f"\n  {query!r}")
                _print_hits(index.search(_query_vector(plugin, query, None), 3), indent="  ")
            probe = gallery[0][0]
            print(f"\nImage -> image, query {probe.name}:")
            _print_hits(index.search(_query_vector(plugin, None, str(probe)), 4), indent="  ")
        s = plugin.get_statistics()
        print(
            f"\n{s['images']} images and {s['texts']} texts embedded, "
            f"p50 {s['p50_latency_ms']:.1f} ms a call"
        )
    finally:
        plugin.shutdown()
    return 0


# -- helpers -----------------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> PluginConfig:
    if args.config:
        config = PluginConfig.from_file(args.config)
        if args.model:
            config = replace(config, model=replace(config.model, path=args.model))
    else:
        config = PluginConfig(model=ModelConfig(path=args.model or str(demo_model_path())))
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise CLIError("--batch-size must be >= 1")
        config = replace(config, max_batch_size=args.batch_size)
    if args.backend:
        config = replace(config, backend=BackendType(args.backend))
    return config


def _start(args: argparse.Namespace) -> OnnxClipPlugin:
    config = _config(args)
    plugin = OnnxClipPlugin()
    if not plugin.initialize(config):
        raise CLIError(f"cannot initialise the model: {plugin.last_error}")
    return plugin


def _expand(paths: Sequence[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
            )
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
    names: list[str], results: list[EmbeddingResult], output: str | None, *, is_text: list[bool]
) -> None:
    if output and output.endswith(".npy"):
        dims = {r.embedding.shape[0] for r in results if r.embedding is not None}
        dim = dims.pop() if dims else 0
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


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
