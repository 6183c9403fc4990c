"""Models by name: a string (path, Hub repo id, catalogue name) → a verified local folder.

How a model string is resolved (``--model``, ``model.path``, ``POST /admin/reload``):

1. An existing local path (file or directory) always wins, as it is.
2. ``NAME@REV`` splits off a revision (branch, tag or commit); otherwise the revision is ``main``.
3. A catalogue name (``ViT-B-32__openai``; case-insensitive) stands for its entry's repo.
4. Any other ``org/name`` is a Hub repo id; its layout is read from the repo's file listing.
5. Anything else is an unknown name: :class:`ModelNotFoundError` with the closest catalogue
   names.

A repo is fetched with ``huggingface_hub`` into its standard cache (``HF_HOME`` /
``HF_HUB_CACHE``; ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and proxies as the client reads
them), only the files its layout needs. The client does not check a downloaded file against the
SHA-256 the Hub lists for it, so this module does: every file of the pinned commit against the
tree listing (LFS files by SHA-256, small files by their git blob id). A mismatch deletes the
cached copy and refuses. The verified digests and the commit are recorded beside the cached repo
(``<repo cache>/themis/<commit>.json``); a load from the cache never asks the network and hands
the recorded digests to the loader, which re-hashes the files against them before use.
One process at a time pulls a repo (a file lock); a second waits, then finds it cached.

Every value the Hub returns is untrusted: a commit is 40 lowercase hex characters, a listed
name stays inside the snapshot, a listed size is a bounded integer and a file is cut at the first
byte past it; file answers' ``X-Repo-Commit`` and ``ETag`` (which the client names cache files
after) must be hex digests.

``source`` classifies strings, checks listing entries and knows each layout's allow-list;
``cache`` owns the local cache, the records and the lock (``files.file_lock``); ``pull`` is the
home of ``huggingface_hub`` and exports a PyTorch checkpoint by running ``themis-clip export`` in
a child process with a memory and time limit, after checking its config against its weights
(:mod:`themis_clip.models.checkpoint`); it never imports the exporter.
"""

from __future__ import annotations

from themis_clip.models.hub.cache import (
    cache_root,
    cached_info,
    describe,
    is_cached,
    remove,
    verify_cached,
)
from themis_clip.models.hub.pull import pull, resolve
from themis_clip.models.hub.source import (
    CachedFile,
    ModelSource,
    ResolvedModel,
    detect_layout,
    parse_source,
    select_files,
)

__all__ = [
    "CachedFile",
    "ModelSource",
    "ResolvedModel",
    "cache_root",
    "cached_info",
    "describe",
    "detect_layout",
    "is_cached",
    "parse_source",
    "pull",
    "remove",
    "resolve",
    "select_files",
    "verify_cached",
]
