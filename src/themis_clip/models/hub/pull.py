"""The network side: ask the Hub for a commit and its listing, fetch, verify, export.

This module is the home of ``huggingface_hub`` (its errors are translated here into ours).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from themis_clip.errors import IntegrityError, ModelError, ModelFormatError, ModelNotFoundError
from themis_clip.files import sha256_of
from themis_clip.models.catalogue import RepoLayout
from themis_clip.models.checkpoint import check_checkpoint, pickled_message
from themis_clip.models.hub.cache import (
    RECORD_FORMAT,
    cached,
    from_record,
    read_record,
    repo_lock,
    storage_dir,
    write_record,
    write_ref,
)
from themis_clip.models.hub.source import (
    ModelSource,
    ResolvedModel,
    detect_layout,
    is_commit,
    listed_file,
    parse_source,
    select_files,
)

__all__ = ["progress_bar_class", "pull", "resolve"]

log = logging.getLogger(__name__)


def resolve(
    text: str,
    *,
    revision: str | None = None,
    precision: str | None = None,
    allow_download: bool = True,
    cache_dir: str | Path | None = None,
) -> ResolvedModel:
    """Turn a model string into a local, verified model (pulling it if allowed and needed).

    A cached, verified model is used without any network request.

    Raises:
        ModelNotFoundError: unknown name, no such repo or revision, gated, or not cached while
            offline / downloads not allowed. ModelFormatError: a repo layout we cannot load.
        IntegrityError: a downloaded file differs from the digest the Hub lists.
    """
    source = parse_source(text, revision=revision)
    if source.path is not None:
        return ResolvedModel(path=source.path, source=source)
    assert source.repo is not None
    found = cached(source, precision, cache_dir)
    if found is not None:
        return found
    if not allow_download:
        raise ModelNotFoundError(
            f"model {source.label} ({source.repo}@{source.revision}) is not in the cache and "
            "downloads are not allowed here: run `themis-clip models pull "
            f"{source.label}` first (or start the server with --allow-pull)"
        )
    return pull(text, revision=revision, precision=precision, cache_dir=cache_dir)


def pull(
    text: str,
    *,
    revision: str | None = None,
    precision: str | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> ResolvedModel:
    """Ask the Hub for the revision's commit, fetch what is missing, verify, record.

    Raises: as :func:`resolve`.
    """
    source = parse_source(text, revision=revision)
    if source.path is not None:
        return ResolvedModel(path=source.path, source=source)
    assert source.repo is not None
    listing = _remote_listing(source, cache_dir)  # read-only: before the lock
    # One process at a time fetches a repo; the next one finds the record and fetches nothing.
    with repo_lock(source.repo, cache_dir):
        return _pull_locked(source, listing, precision, cache_dir, progress)


def _pull_locked(
    source: ModelSource,
    listing: tuple[str, dict[str, dict[str, Any]]],
    precision: str | None,
    cache_dir: str | Path | None,
    progress: bool,
) -> ResolvedModel:
    assert source.repo is not None
    repo = source.repo
    storage = storage_dir(repo, cache_dir)
    commit, tree = listing
    record = read_record(storage, commit)
    if record is not None:
        found = from_record(source, storage, commit, record, precision)
        if found is not None:
            write_ref(storage, source.revision, commit)
            return found
    layout = source.entry.layout if source.entry is not None else None
    layout = detect_layout(list(tree)) if layout is None else layout
    if layout is None or detect_layout(list(tree)) is None:
        shown = ", ".join(sorted(tree)[:8]) + (" ..." if len(tree) > 8 else "")
        raise ModelFormatError(
            f"{repo}@{source.revision} holds no model layout we load (immich, transformers.js, "
            f"fastembed, themis-clip, clip-as-service/lakera ONNX, a transformers PyTorch "
            f"checkpoint, or immich's OCR folders); its files: {shown or 'none'}"
        )
    if layout == RepoLayout.PYTORCH:
        if "model.safetensors" not in tree:
            raise ModelFormatError(pickled_message(f"{repo}@{source.revision}"))
        _export_extra(source)  # fail before downloading gigabytes we cannot use
    needed = select_files(list(tree), layout, precision)
    snapshot = _download(repo, commit, {rel: tree[rel] for rel in needed}, cache_dir, progress)
    verified = dict(record["verified"]) if record else {}
    for rel in needed:
        verified[rel] = _verify_file(repo, commit, snapshot / rel, rel, tree[rel])
    new_record: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "repo": repo,
        "commit": commit,
        "layout": layout,
        "tree": tree,
        "verified": verified,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "exports": dict(record.get("exports", {})) if record else {},
    }
    if layout == RepoLayout.PYTORCH:
        new_record["exports"][precision or "fp32"] = _export(
            source, storage, snapshot, commit, precision or "fp32"
        )
    text_repo = source.entry.text_repo if source.entry is not None else None
    if text_repo:
        text = pull(text_repo, cache_dir=cache_dir, progress=progress)
        new_record["text_repo"] = text.path.relative_to(storage.parent).as_posix()
        new_record["text_sha256"] = text.digests[str(text.path)]
        tok = text.path.parent / "tokenizer.json"
        if str(tok) in text.digests:
            new_record["text_tokenizer_sha256"] = text.digests[str(tok)]
    write_record(storage, commit, new_record)
    write_ref(storage, source.revision, commit)
    found = from_record(source, storage, commit, new_record, precision)
    if found is None:
        raise ModelError(f"{repo}@{commit}: pulled but the cache is incomplete")
    log.info("model %s pulled: %s@%s, %d files verified", source.label, repo, commit, len(needed))
    return ResolvedModel(
        path=found.path,
        text_path=found.text_path,
        source=source,
        commit=commit,
        layout=layout,
        digests=found.digests,
        downloaded=True,
    )


def _hub_errors(source: ModelSource) -> Callable[[BaseException], ModelError]:
    """A translator of ``huggingface_hub`` / transport errors into ours, for ``source``."""
    from huggingface_hub import errors as hf_errors

    repo, rev, label = source.repo, source.revision, source.label

    def translate(exc: BaseException) -> ModelError:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, hf_errors.GatedRepoError) or status in (401, 403):
            return ModelNotFoundError(
                f"{repo} is gated or private (HTTP {status}): accept its terms on the Hub and "
                "set HF_TOKEN to a token that may read it"
            )
        if isinstance(exc, hf_errors.RevisionNotFoundError):
            return ModelNotFoundError(f"{repo} has no revision {rev!r} (branch, tag or commit)")
        if isinstance(exc, hf_errors.RepositoryNotFoundError):
            return ModelNotFoundError(f"no repository {repo} on the Hub")
        if isinstance(exc, hf_errors.HfHubHTTPError) and status is not None:
            return ModelNotFoundError(f"the Hub answered HTTP {status} for {repo}: {exc}")
        if isinstance(exc, hf_errors.OfflineModeIsEnabled):
            why = "HF_HUB_OFFLINE is set"
        else:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else '?'}"
        return ModelNotFoundError(
            f"model {label} ({repo}@{rev}) is not cached and the Hub cannot be reached "
            f"({why}). "
            f"On a machine that can reach it, run `themis-clip models pull {label}`, then copy "
            f"its cache folder {storage_dir(str(repo), None).name} into this machine's "
            "HF_HUB_CACHE (default ~/.cache/huggingface/hub)"
        )

    return translate


def _transport_errors() -> tuple[type[BaseException], ...]:
    import httpx2

    return (OSError, httpx2.HTTPError)


#: more files than any model repo holds: a listing beyond it is refused, not read to the end
MAX_LISTED_FILES = 20_000


def _malformed(
    source: ModelSource, exc: BaseException, *, entry: tuple[str, str] | None = None
) -> ModelFormatError:
    """The client's own refusal of a malformed answer (``ValueError``, ``KeyError``...),
    naming the listed file and the part of its entry when the client got that far."""
    first = str(exc).splitlines()[0][:200] if str(exc) else "?"
    if isinstance(exc, KeyError) and exc.args:
        first = f"no {str(exc.args[0])[:40]!r} in it"
    if entry is not None:
        name, part = entry
        return ModelFormatError(
            f"the Hub listed {name[:120]!r} in {source.repo}@{source.revision} with a "
            f"malformed {part}: {first}"
        )
    return ModelFormatError(
        f"the Hub's answer for {source.repo}@{source.revision} is malformed "
        f"({type(exc).__name__}: {first})"
    )


def _remote_listing(
    source: ModelSource, cache_dir: str | Path | None
) -> tuple[str, dict[str, dict[str, Any]]]:
    """``(commit, {path: {size, sha256 | None, blob_id}})`` of the repo at the revision.

    Every value is checked before it is used (the commit names cache files): a commit is 40
    lowercase hex characters, names stay inside the snapshot, sizes are bounded integers.
    """
    from huggingface_hub import HfApi, RepoFile

    translate = _hub_errors(source)
    assert source.repo is not None
    _guard_client()
    api = HfApi()
    try:
        info = api.model_info(source.repo, revision=source.revision)
        commit = info.sha
        if (
            not isinstance(commit, str)
            or not is_commit(commit)
            or (is_commit(source.revision) and commit != source.revision)
        ):
            raise ModelFormatError(
                f"the Hub answered commit {str(commit)[:100]!r} for "
                f"{source.repo}@{source.revision}: a commit is 40 lowercase hex characters "
                "(and the one asked for)"
            )
        tree: dict[str, dict[str, Any]] = {}
        for f in api.list_repo_tree(source.repo, revision=commit, recursive=True):
            if not isinstance(f, RepoFile):
                continue
            if len(tree) >= MAX_LISTED_FILES:
                raise ModelFormatError(
                    f"{source.repo}@{commit[:12]} lists more than {MAX_LISTED_FILES} files"
                )
            sha = f.lfs.sha256 if f.lfs is not None else None
            tree[f.path] = listed_file(f.path, f.size, sha, f.blob_id)
    except ModelError:
        raise
    except _transport_errors() as exc:
        raise translate(exc) from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise _malformed(source, exc, entry=_entry_being_read(exc, RepoFile)) from None
    return commit, tree


def _entry_being_read(exc: BaseException, kind: type[Any]) -> tuple[str, str] | None:
    """``(name, part)`` of the listed file whose entry the client was parsing when it raised.

    The client parses each listing entry in ``RepoFile()``, whose first step stores the name:
    the frame that raised still holds it, and a message naming the file saves the user a guess.
    ``part`` is "LFS entry" when the raw ``lfs`` object was being read, else "entry".
    """
    tb = exc.__traceback__
    while tb is not None:
        local = tb.tb_frame.f_locals
        entry = local.get("self")
        if isinstance(entry, kind) and isinstance(getattr(entry, "path", None), str):
            raw_lfs = local.get("lfs")
            reading_lfs = raw_lfs is not None and getattr(entry, "lfs", None) is None
            return str(entry.path), "LFS entry" if reading_lfs else "entry"
        tb = tb.tb_next
    return None


def _check_answer(response: Any) -> None:
    """Refuse a file answer whose headers the client would build cache paths from
    (``snapshots/<X-Repo-Commit>``, ``.no_exist/<X-Repo-Commit>``, ``blobs/<ETag>``) unless
    they are hex digests: the client writes there before any other check."""
    if "/resolve/" not in response.request.url.path:
        return
    commit = response.headers.get("X-Repo-Commit")
    if commit is not None and not is_commit(commit):
        raise ModelFormatError(
            f"the Hub answered commit {commit[:100]!r} for a file: not 40 lowercase hex characters"
        )
    etag = response.headers.get("X-Linked-Etag") or response.headers.get("ETag")
    if response.status_code < 400 and etag is not None:
        value = etag.removeprefix("W/").strip('"')
        if len(value) not in (40, 64) or value.strip("0123456789abcdef"):
            raise ModelFormatError(f"the Hub answered ETag {etag[:100]!r} for a file: not a digest")


def _guard_client() -> None:
    """Hook :func:`_check_answer` into the client's shared HTTP session (idempotent)."""
    from huggingface_hub import get_session

    session = get_session()
    hooks = session.event_hooks
    if _check_answer not in hooks["response"]:
        hooks["response"] = [*hooks["response"], _check_answer]
        session.event_hooks = hooks


def _download(
    repo: str,
    commit: str,
    files: Mapping[str, Mapping[str, Any]],
    cache_dir: str | Path | None,
    progress: bool,
) -> Path:
    """Fetch ``files`` (name → listing entry) of ``repo@commit``; each file's size is held to
    its listing while it downloads (the client would read any length, then compare)."""
    from huggingface_hub import hf_hub_download

    source = ModelSource(text=repo, repo=repo, revision=commit)
    translate = _hub_errors(source)
    _guard_client()
    for rel, entry in files.items():
        try:
            hf_hub_download(
                repo,
                rel,
                revision=commit,
                cache_dir=str(cache_dir) if cache_dir is not None else None,
                tqdm_class=_held_to_listing(repo, rel, int(entry["size"]), progress),
            )
        except ModelError:
            raise
        except _transport_errors() as exc:
            raise translate(exc) from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise _malformed(source, exc) from None
    return storage_dir(repo, cache_dir) / "snapshots" / commit


def _held_to_listing(repo: str, rel: str, listed: int, progress: bool) -> type[Any]:
    """The client's per-file progress bar class, refusing a body longer than the listing (at
    the first chunk past it) or announced at another size (before the body is read)."""
    base: type[Any] = progress_bar_class() if progress else _SilentBar

    def refuse(got: str) -> IntegrityError:
        return IntegrityError(
            f"{repo}: {rel} is listed at {listed} bytes but the Hub sent {got}; refused "
            "while downloading"
        )

    class Held(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            total = kwargs.get("total")
            if total is not None and int(total) != listed:
                raise refuse(f"a file of {total} bytes")
            self._received = int(kwargs.get("initial") or 0)
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> Any:
            self._received += int(n or 0)
            if self._received > listed:
                raise refuse(f"more ({self._received} bytes so far)")
            return super().update(n)

    return Held


class _SilentBar:
    """A do-nothing progress bar (``progress=False``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.n = 0
        self.total = kwargs.get("total")

    def __enter__(self) -> _SilentBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: float | None = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def refresh(self) -> None:
        pass

    def set_description(self, *a: Any, **k: Any) -> None:
        pass

    def set_description_str(self, *a: Any, **k: Any) -> None:
        pass

    def set_postfix_str(self, *a: Any, **k: Any) -> None:
        pass


def progress_bar_class() -> type[Any]:
    """The client's bars in tqdm's own format: bytes, rate and ETA (the client's byte-bar
    format shows no ETA); on a terminal only, like the client's."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]  # the client's dependency

    class Bar(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("bar_format", None)
            kwargs.pop("name", None)
            if kwargs.get("desc") == "Downloading bytes":  # for plain HTTP: the same bytes again
                kwargs["disable"] = True
            kwargs.setdefault("disable", None)  # None: shown on a terminal only
            super().__init__(*args, **kwargs)

    return Bar


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _verify_file(repo: str, commit: str, path: Path, rel: str, entry: Mapping[str, Any]) -> str:
    """Check a fetched file against the listing; on a mismatch delete it and refuse."""
    expected = entry.get("sha256")
    actual = sha256_of(path)
    if expected is not None:
        if actual == str(expected).lower():
            return actual
        _evict(path)
        raise IntegrityError(
            f"{repo}@{commit[:12]}: {rel} is corrupt: the Hub lists SHA-256 {expected}, the "
            f"downloaded file has {actual}; the cached copy was deleted, pull again"
        )
    blob = _git_blob_sha1(path)
    if blob != str(entry.get("blob_id")):
        _evict(path)
        raise IntegrityError(
            f"{repo}@{commit[:12]}: {rel} is corrupt: the Hub lists git blob "
            f"{entry.get('blob_id')}, the downloaded file has {blob}; the cached copy was "
            "deleted, pull again"
        )
    return actual


def _evict(path: Path) -> None:
    """Delete a cached file: the link, and the blob it points to if that is in the repo's
    ``blobs`` folder (never a file elsewhere a foreign link may name)."""
    target = path.resolve()
    blobs = next((p.parent / "blobs" for p in path.parents if p.name == "snapshots"), None)
    inside = blobs is not None and target.is_relative_to(blobs.resolve())
    for p in (target, path) if inside else (path,):
        with suppress(FileNotFoundError):
            p.unlink()


#: what an export may take (CPU export of the largest CLIP towers with int8 calibration: minutes)
EXPORT_TIMEOUT_S = 3600
#: address space an export may use: a floor for torch itself, plus a multiple of the weights
_EXPORT_MEMORY_FLOOR = 8 * 1024**3
_EXPORT_MEMORY_PER_WEIGHT_BYTE = 8
_EXPORT_MODULES = ("torch", "transformers", "onnx", "onnxscript")


def _export_extra(source: ModelSource) -> None:
    """Refuse before downloading when the export extra is missing (checked in a child process,
    so this one never imports torch)."""
    code = "import " + ", ".join(_EXPORT_MODULES)
    done = subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode == 0:
        return
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    missing = next((m for m in _EXPORT_MODULES if f"'{m}'" in last), last)
    alt = source.entry.onnx_alternative if source.entry is not None else None
    ready = f"; or use the ready ONNX model {alt!r}" if alt else ""
    raise ModelFormatError(
        f"{source.repo} is a PyTorch checkpoint: exporting it on pull needs the export extra "
        f"({missing} is missing): pip install 'themis-onnx-clip[export]'{ready}"
    )


def _export(
    source: ModelSource,
    storage: Path,
    snapshot: Path,
    commit: str,
    precision: str,
) -> dict[str, Any]:
    """Export a verified checkpoint to ONNX in a child process (``themis-clip export``) with
    a memory and time limit: a runaway export ends there, not in the server."""
    check_checkpoint(snapshot)  # config against the weights' header, before building anything
    rel = f"themis/export/{commit}-{precision.replace(',', '+')}"
    out = storage / rel
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    precisions = ["fp32", *[p for p in precision.split(",") if p and p != "fp32"]]
    log.info("exporting %s@%s to ONNX (%s)", source.repo, commit[:12], ",".join(precisions))
    weights = (snapshot / "model.safetensors").stat().st_size
    limit = _EXPORT_MEMORY_FLOOR + _EXPORT_MEMORY_PER_WEIGHT_BYTE * weights
    cmd = [sys.executable, "-m", "themis_clip.cli", "export", str(snapshot), str(tmp)]
    cmd += ["--precision", ",".join(precisions), "--name", source.label]
    why = _run_limited(cmd, limit, EXPORT_TIMEOUT_S)
    if why is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelFormatError(f"exporting {source.repo}@{commit[:12]} to ONNX failed: {why}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    files = {
        p.relative_to(out).as_posix(): sha256_of(p) for p in sorted(out.rglob("*")) if p.is_file()
    }
    return {"path": rel, "files": files}


def _run_limited(cmd: list[str], memory_bytes: int, timeout_s: float) -> str | None:
    """Run ``cmd`` with an address-space limit (Linux) and a deadline; None when it succeeded,
    else why not (its last error line, the limit it hit)."""
    proc = subprocess.Popen(  # noqa: S603 - this interpreter, our own command line
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    with suppress(ImportError, AttributeError, OSError):
        import resource

        resource.prlimit(proc.pid, resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"it ran past its time limit of {timeout_s:.0f} s and was stopped"
    if proc.returncode == 0:
        return None
    lines = [line for line in err.strip().splitlines() if line.strip()]
    last = lines[-1].removeprefix("themis-clip: error: ") if lines else ""
    if proc.returncode < 0 or "MemoryError" in err or not last:
        return (
            f"it stopped (exit {proc.returncode}) within its memory limit of "
            f"{memory_bytes // 1024**2} MiB: {last or 'no message'}"
        )
    return last
