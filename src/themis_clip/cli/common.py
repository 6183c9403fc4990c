"""What every command shares: the model options, the configuration they build, errors."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from themis_clip import jsonio
from themis_clip.config import ModelConfig, PluginConfig, SearchConfig, SessionConfig
from themis_clip.errors import ConfigError, ThemisClipError
from themis_clip.files import file_lock
from themis_clip.index.settings import GraphDType
from themis_clip.interface import BackendType
from themis_clip.plugin import OnnxClipPlugin
from themis_clip.resources import demo_model_path
from themis_clip.vocabulary import InferencePrecision, ModelIdentity

DEFAULT_INDEX = "themis-index.db"


class CLIError(ThemisClipError):
    """A usage or set-up problem: message to stderr, exit code 2."""


#: Characters that would break a report line or drive the terminal: controls (a newline, an
#: escape sequence), undecodable bytes of a file name (surrogates) and line separators.
_UNSHOWN = frozenset({"Cc", "Cs", "Zl", "Zp"})


def shown(text: str) -> str:
    """``text`` for one terminal line: a file name's control characters and undecodable bytes
    escaped (``\\n``, ``\\x1b``, and ``\\xff`` for a byte that is not UTF-8), everything
    else as it is."""
    if text.isprintable():
        return text
    return "".join(_escaped(ch) if unicodedata.category(ch) in _UNSHOWN else ch for ch in text)


def _escaped(ch: str) -> str:
    if "\udc80" <= ch <= "\udcff":  # an undecodable byte of a name (os.fsdecode's escape)
        return f"\\x{ord(ch) - 0xDC00:02x}"
    return ch.encode("unicode_escape").decode("ascii")


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="model directory, image-tower .onnx, Hub repo id (org/name[@rev]) or catalogue "
        "name (themis-clip models list); default: the shipped demo model",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a JSON settings file (model, backend, preprocessing, search; see "
        "docs/configuration.md); flags override it",
    )
    p.add_argument(
        "--backend",
        choices=[b.value for b in BackendType],
        help="where the model runs (default auto: the fastest available, else cpu)",
    )
    p.add_argument(
        "--openvino-precision",
        choices=[str(x) for x in InferencePrecision],
        help="the arithmetic OpenVINO runs the model in (default auto: the device's fastest "
        "that passes the canary: bf16 on CPUs with AMX or AVX-512 BF16, else f32)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="images or texts per model run (default 32); larger uses more memory",
    )


def start_up_cache() -> str:
    """Where commands keep start-up work unless a config names its own
    ``session.optimized_model_cache_dir``: ``$XDG_CACHE_HOME/themis-clip/sessions`` (default
    ``~/.cache/themis-clip/sessions``). A command is started again and again (``index`` of a
    few new photos, ``search``), so its load is most of its time: on OpenVINO 0.5 s, not 2.5."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "themis-clip", "sessions")


def _config_file(path: str) -> PluginConfig:
    """``--config``'s file; one without a ``model`` section takes the default model (the
    shipped demo model, or ``--model``'s, which replaces it), so that a file of a few settings
    (``{"preprocess": {"decode_mode": "draft"}}``) is enough. One that does not name
    ``session.optimized_model_cache_dir`` gets :func:`start_up_cache` (``null`` turns it off)."""
    p = Path(path)
    try:
        data = jsonio.loads(p.read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid JSON: {exc}") from exc
    if isinstance(data, dict) and "model" not in data:
        data = {**data, "model": {"path": str(demo_model_path())}}
    if isinstance(data, dict) and isinstance(data.get("session", {}), dict):
        session = data.get("session", {})
        if "optimized_model_cache_dir" not in session:
            data = {**data, "session": {**session, "optimized_model_cache_dir": start_up_cache()}}
    return PluginConfig.from_dict(data, base_dir=p.parent)


def config_from(args: argparse.Namespace) -> PluginConfig:
    if args.config:
        config = _config_file(args.config)
        if args.model:
            config = replace(config, model=replace(config.model, path=args.model))
    else:
        config = PluginConfig(
            model=ModelConfig(path=args.model or str(demo_model_path())),
            session=SessionConfig(optimized_model_cache_dir=start_up_cache()),
        )
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise CLIError("--batch-size must be >= 1")
        config = replace(config, max_batch_size=args.batch_size)
    if args.backend:
        config = replace(config, backend=BackendType(args.backend))
    if getattr(args, "openvino_precision", None):
        precision = InferencePrecision(args.openvino_precision)
        config = replace(config, openvino=replace(config.openvino, precision=precision))
    return config


def index_args(p: argparse.ArgumentParser, *, default: str | None = DEFAULT_INDEX) -> None:
    """``--index`` and the search tuning flags (each overrides the config's ``search``)."""
    where = f" (default: the config's search.index, else {default})" if default else ""
    p.add_argument("--index", help=f"index: an SQLite file or a postgresql:// URL{where}")
    p.add_argument(
        "--target-recall", type=float, help="recall@10 the search graph must reach (0.98)"
    )
    p.add_argument(
        "--graph-dtype", choices=[str(d) for d in GraphDType], help="search graph vector type (i8)"
    )


def index_location(args: argparse.Namespace, default: str | None = DEFAULT_INDEX) -> str | None:
    """Where the index is: ``--index``, else the config's ``search.index``, else ``default``."""
    if args.index:
        return str(args.index)
    return config_from(args).search.index or default


@contextmanager
def index_writer(index: str) -> Iterator[None]:
    """Hold the one-writer lock of ``index`` (``index`` and ``migrate`` share it): a second
    writer would embed every new item again beside the first, or move files under it.

    Raises:
        CLIError: another writer holds it, or the index's folder is read-only.
    """
    if index.startswith(("postgresql://", "postgres://")):
        from themis_clip.index.stores.postgres import writer_lock

        with writer_lock(index):
            yield
        return
    lock = Path(index + ".lock")
    try:
        with file_lock(lock, timeout_s=0):
            yield
    except TimeoutError:
        raise CLIError(
            f"another `themis-clip index` or `migrate` is updating {index}; "
            "run this one when it ends"
        ) from None
    except OSError as exc:  # read-only media, no permission (raised taking the lock)
        if exc.filename not in (str(lock), lock):
            raise
        raise CLIError(
            f"index {index} is read-only here ({exc.strerror or exc}): search it as it is, or "
            "copy it somewhere writable to change it"
        ) from None
    finally:
        if not Path(index).exists():
            lock.unlink(missing_ok=True)  # no index was left: no lock file beside nothing


def graph_settings(args: argparse.Namespace) -> SearchConfig:
    """The self-tuner's settings: the config's ``search`` section, overridden by flags."""
    search = config_from(args).search
    target = args.target_recall if args.target_recall is not None else search.target_recall
    try:  # SearchConfig checks it; the message names the flag
        return dataclasses.replace(
            search, target_recall=target, graph_dtype=args.graph_dtype or search.graph_dtype
        )
    except ConfigError as exc:
        raise CLIError(f"--target-recall {exc}") from None


def not_initialize_failed(record: logging.LogRecord) -> bool:
    """A log filter: the plugin logs a failed start for library callers; the CLI's exit
    message says it, once."""
    return not str(record.msg).startswith("initialize failed")


def start_plugin(
    args: argparse.Namespace,
    config: PluginConfig | None = None,
    *,
    lazy_textual: bool = False,
) -> OnnxClipPlugin:
    """The plugin of ``args`` (or of ``config``, where a command adjusted it), initialised
    (``lazy_textual``: the text tower opens on its first use; indexing never needs it)."""
    config = config or config_from(args)
    plugin = OnnxClipPlugin(lazy_textual=lazy_textual)
    if not plugin.initialize(config):
        raise CLIError(f"cannot initialise the model: {plugin.last_error}")
    return plugin


def stamp_of(plugin: OnnxClipPlugin) -> ModelIdentity:
    identity = plugin.model_identity
    assert identity is not None
    return identity


def progress_bar(desc: str, *, unit: str = "img") -> tuple[Callable[[int, int], None], Any]:
    """A tqdm bar on stderr fed by ``progress(done, total)`` callbacks: ``(callback, bar)``."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    bar = tqdm(total=0, unit=unit, file=sys.stderr, desc=desc, disable=None)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
            bar.refresh()
        bar.update(done - bar.n)

    return update, bar
