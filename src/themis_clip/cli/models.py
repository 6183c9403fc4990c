"""``models``: the catalogue and the local cache (list, pull, info, rm, verify)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from themis_clip.cli.common import CLIError
from themis_clip.errors import IntegrityError
from themis_clip.models import hub
from themis_clip.models.catalogue import catalogue, find_entry


def register(sub: Any) -> None:
    p = sub.add_parser("models", help="models by name: the catalogue, pulls and the cache")
    msub = p.add_subparsers(dest="models_command", required=True)

    q = msub.add_parser("list", help="the catalogue (* = cached here)")
    q.add_argument("--family", help="only this family (clip, siglip, siglip2, chinese-clip, ...)")
    q.add_argument("--language", help="only models for this language (en, zh, multilingual)")
    q.add_argument("--json", action="store_true", help="JSON lines, one entry each")
    q.set_defaults(func=_cmd_list)

    q = msub.add_parser("pull", help="download, verify and cache a model")
    q.add_argument("name", help="catalogue name, Hub repo id (org/name[@rev])")
    q.add_argument("--revision", help="branch, tag or commit (default: main)")
    q.add_argument(
        "--precision",
        help="transformers.js: fp32, fp16, int8, uint8, quantized, q4, ...; PyTorch "
        "checkpoints: the export's extra precision (int8, fp16)",
    )
    q.set_defaults(func=_cmd_pull)

    q = msub.add_parser("info", help="what the catalogue and the cache know of a model")
    q.add_argument("name")
    q.add_argument("--revision")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_cmd_info)

    q = msub.add_parser("rm", help="delete a model's cache folder")
    q.add_argument("name")
    q.set_defaults(func=_cmd_rm)

    q = msub.add_parser("verify", help="re-hash a cached model against its verified digests")
    q.add_argument("name")
    q.add_argument("--revision")
    q.set_defaults(func=_cmd_verify)


def _cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for entry in catalogue():
        if args.family and entry.family.lower() != args.family.lower():
            continue
        if args.language and args.language.lower() not in [
            x.lower() for x in entry.languages or ()
        ]:
            continue
        rows.append({**entry.as_dict(), "cached": hub.is_cached(entry.name)})
    if args.json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
        return 0
    if not (args.family or args.language):
        print(
            "start here: ViT-B-32__openai (English, 512-d, fast on a CPU); "
            "nllb-clip-base-siglip__v1 (200 languages); ViT-B-16-SigLIP-384__webli "
            "(English, better, slower)"
        )
    print(f"  {'name':<52} {'family':<14} {'dim':>5} {'px':>4}  {'languages':<12} repo")
    for row in rows:
        mark = "*" if row["cached"] else " "
        dim = row["embedding_dim"] or "-"
        size = row["image_size"] or "-"
        langs = ",".join(row["languages"] or ["?"])
        print(
            f"{mark} {row['name']:<52} {row['family']:<14} {dim:>5} {size:>4}  {langs:<12} "
            f"{row['repo']}"
        )
    print("(* = cached here; px: the image side the model reads; ? = not recorded)")
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    resolved = hub.pull(args.name, revision=args.revision, precision=args.precision)
    if resolved.source.repo is None:
        raise CLIError(f"{args.name} is a local path; nothing to pull")
    print(
        f"{resolved.source.label}: {resolved.source.repo}@{resolved.commit} "
        f"({resolved.layout}, {len(resolved.digests)} files verified) -> {resolved.path}"
    )
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    source = hub.parse_source(args.name, revision=args.revision)
    if source.repo is None:
        raise CLIError(f"{args.name} is a local path, not a model name")
    entry = source.entry or find_entry(source.repo)
    cached = hub.cached_info(args.name, revision=args.revision)
    out: dict[str, Any] = {
        "name": source.label,
        "repo": source.repo,
        "revision": source.revision,
        "catalogue": entry.as_dict() if entry is not None else None,
        "cached": cached is not None,
    }
    if cached is not None:
        out.update(
            commit=cached["commit"],
            layout=cached["layout"],
            path=cached["path"],
            variants=cached["variants"],
            exports=cached["exports"],
            verified_at=cached["verified_at"],
            files=[{"path": f.path, "size": f.size, "sha256": f.sha256} for f in cached["files"]],
        )
    if args.json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0
    for key in ("name", "repo", "revision", "commit", "layout", "path", "variants", "exports"):
        if key in out:
            print(f"{key:<9} {out[key]}")
    if entry is not None:
        figures = ("family", "embedding_dim", "image_size", "context_length", "languages")
        print("catalogue " + ", ".join(f"{k}={getattr(entry, k)}" for k in figures))
    if cached is None:
        print(f"cached    no (themis-clip models pull {source.label})")
    for f in out.get("files", []):
        print(f"  {f['sha256']}  {f['size']:>12}  {f['path']}")
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    removed = hub.remove(args.name)
    print(f"removed {removed}" if removed else f"{args.name}: not in the cache")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    files = hub.verify_cached(args.name, revision=args.revision)
    bad = [f for f in files if not f.ok]
    for f in files:
        print(f"{'ok ' if f.ok else 'BAD'}  {f.sha256}  {f.path}")
    if bad:
        raise IntegrityError(
            f"{len(bad)} file(s) of {args.name} fail verification: "
            f"{', '.join(f'{f.path} ({f.problem})' for f in bad)}; run "
            f"`themis-clip models rm {args.name}` and pull again"
        )
    return 0
