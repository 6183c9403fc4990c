"""Loading a model: resolve its directory, verify its digest, plan providers, open sessions.

``load_model`` builds a :class:`~themis_clip.engine.ClipModel`: the model directory (ours or a
peer's) becomes a :class:`~themis_clip.models.spec.ModelSpec`; the session source is the file or its
memory-mappable copy; the provider plans are tried best first; the embedding dimension and the
image specification are resolved from the graph, the manifest and the configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip._version import __version__
from themis_clip.budget import PixelBudget
from themis_clip.canary import cached_reference, probe, verdict
from themis_clip.config import PluginConfig
from themis_clip.engine import ClipModel, TextualTower, VisualTower
from themis_clip.errors import (
    BackendUnavailableError,
    ConfigError,
    ModelError,
    ModelFormatError,
    ModelMismatchError,
    ThemisClipError,
)
from themis_clip.interface import BackendType
from themis_clip.models.external_data import MappingUnavailable, mapped_model
from themis_clip.models.hashing import HashFunction, sha256_file
from themis_clip.models.hub import ResolvedModel
from themis_clip.models.hub import resolve as resolve_source
from themis_clip.models.layout import model_identity_digest, resolve_model
from themis_clip.models.spec import ImageSpec, ModelSpec
from themis_clip.ocr import OCREngine
from themis_clip.preprocess.image import ImagePreprocessor
from themis_clip.preprocess.text import make_tokenizer
from themis_clip.runtime import (
    BACKEND_ENV,
    ORTSession,
    ProviderPlan,
    SessionSettings,
    auto_backend,
    available_providers,
    create_session,
    forget_compiled,
    kept_folder,
    model_file_key,
    openvino_version,
    plan_providers,
)
from themis_clip.vocabulary import InferencePrecision, Layout, LoadingMode, ModelIdentity

__all__ = [
    "CanaryFailedError",
    "declared_preprocessor",
    "load_model",
    "load_ocr",
    "session_settings",
]

log = logging.getLogger(__name__)


def load_model(
    config: PluginConfig,
    backend: BackendType,
    *,
    available: Sequence[str] | None = None,
    hash_fn: HashFunction = sha256_file,
    session_factory: Callable[..., ORTSession] = create_session,
    budget: PixelBudget | None = None,
    lazy_textual: bool = False,
) -> ClipModel:
    """Resolve, verify and load ``config.model`` on ``backend``.

    ``budget`` is the decoded-pixel budget the model's image decodes share (the plugin's).
    With ``lazy_textual`` the text tower (tokenizer and session) is opened on its first use, not
    here: image-only callers (``themis-clip index``) start in about half the time. Its output
    width is then checked on its first run rather than at load.

    Raises:
        ModelError (and subclasses), BackendUnavailableError, ConfigError.
    """
    mc = config.model
    local, spec = _resolve(config)
    expected = mc.expected_sha256 if mc.expected_sha256 is not None else local.digests or None
    digest = model_identity_digest(spec, expected, hash_fn)
    settings = session_settings(config)
    pinned = backend is BackendType.AUTO
    if pinned:
        backend = auto_backend()
    forced = config.openvino.precision
    if forced is not InferencePrecision.AUTO and backend not in (
        BackendType.AUTO,
        BackendType.OPENVINO,
    ):
        # Said, never ignored: an arithmetic was asked for that this backend never runs.
        why = (
            f"openvino.precision forces OpenVINO's precision ({forced}), which the {backend} "
            "backend does not use"
        )
        if not pinned:
            raise ConfigError(f"{why}: pick backend openvino or auto")
        log.warning("%s (%s=%s pins what auto means)", why, BACKEND_ENV, backend)
    plans = plan_providers(
        backend,
        # an explicit CPU needs no probe (listing OpenVINO's devices loads its plugin)
        available
        if available is not None
        else ([] if backend is BackendType.CPU else available_providers()),
        settings=settings,
    )
    sources = {
        tower: _session_source(path, mc.enable_mmap_loading, mc.mmap_cache_dir, hash_fn)
        for tower, path in (("visual", spec.visual_path), ("textual", spec.textual_path))
        if path is not None
    }
    load_path, mode, note = sources["visual"]
    prepack = (
        config.prepack_weights if config.prepack_weights is not None else mode != LoadingMode.MMAP
    )
    settings = replace(settings, prepack_weights=prepack, model_digest=digest)
    t_path, t_mode, t_note = sources.get("textual", (load_path, mode, None))
    note = note or t_note
    reference = plan_providers(BackendType.CPU, ["CPUExecutionProvider"], settings=settings)[0]
    once = replace(settings, optimized_cache_dir=None)  # the reference session's settings
    floor = config.canary_min_cosine

    def canary(
        tower: VisualTower | TextualTower, plan: ProviderPlan, path: Path, path_mode: str
    ) -> float:
        """The tower's canary against CPU fp32; below the floor: :class:`CanaryFailedError`."""

        def embed_alone(items: Sequence[Any]) -> npt.NDArray[np.float32]:
            # its vectors are kept (below), so its optimised graph would never be read again
            ref_session = session_factory(
                path, reference, once, loading_mode=path_mode, name=path.name
            )
            try:
                ref: VisualTower | TextualTower
                if isinstance(tower, VisualTower):
                    ref = VisualTower(
                        ref_session, config.max_batch_size, pooler_is_embedding=pooler
                    )
                else:
                    ref = TextualTower(
                        ref_session,
                        tower.tokenizer,
                        config.max_batch_size,
                        pooler_is_embedding=pooler,
                    )
                return np.concatenate([ref.run(x) for x in items])
            finally:
                ref_session.close()

        folder = None
        if settings.optimized_cache_dir:
            try:
                folder = kept_folder(
                    Path(settings.optimized_cache_dir), "canary", path, settings.model_digest
                )
            except OSError as exc:
                log.warning("canary references not kept: %s", exc)
        fresh_session = tower.session.optimized_cache != "hit"
        kept = None
        if folder is not None and plan.backend is BackendType.OPENVINO:
            kept = verdict(folder, repr(plan), openvino_version(), __version__)
            earlier = kept.read()
            if earlier is not None and earlier < floor:  # no compile again on every start
                raise CanaryFailedError(
                    _refusal(plan, tower, earlier, floor)
                    + f" (measured on a fresh compile at an earlier load; kept in {kept.path})"
                )
        if folder is not None:
            key = model_file_key(path, "canary", settings.model_digest)
            result = probe(tower, cached_reference(folder, key, embed_alone), floor, preprocessor)
            if not result.passed:  # never refuse a provider on a kept reference: a fresh one
                fresh = cached_reference(folder, key, embed_alone, refresh=True)
                result = probe(tower, fresh, floor, preprocessor)
        else:
            result = probe(tower, embed_alone, floor, preprocessor)
        log.info(
            "canary %s %s: min cosine %.10g to cpu f32 (floor %r)",
            plan.describe(),
            result.tower,
            result.min_cosine,
            result.floor,
        )
        if not result.passed:
            if kept is not None and fresh_session:  # the provider's own figure: kept
                kept.write(result.min_cosine)
            raise CanaryFailedError(
                _refusal(plan, tower, result.min_cosine, floor),
                kept=None if fresh_session else path,
            )
        return result.min_cosine

    pooler = spec.pooler_is_embedding
    failures: list[str] = []
    refused: list[str] = []
    queue = list(plans)
    recompiled: list[tuple[ProviderPlan, Path]] = []
    while queue:
        plan = queue.pop(0)
        sessions: list[ORTSession] = []
        try:
            visual_session = session_factory(
                load_path, plan, settings, loading_mode=mode, name=spec.visual_path.name
            )
            sessions.append(visual_session)
            visual = VisualTower(visual_session, config.max_batch_size, pooler_is_embedding=pooler)
            image_spec = _resolve_image_spec(spec, config, visual)
            preprocessor = _preprocessor(spec, config, image_spec, budget)
            cosines: dict[str, float] = {}
            if plan.needs_canary:
                cosines["visual"] = canary(visual, plan, load_path, mode)
            textual = None
            open_textual: Callable[[], TextualTower] | None = None
            if spec.textual_path is not None and spec.tokenizer_path is not None:
                open_textual = _textual_opener(
                    spec, config, plan, settings, session_factory, t_path, t_mode, canary, cosines
                )
                if not lazy_textual:
                    textual = open_textual()
                    sessions.append(textual.session)
            dim = _resolve_dim(spec, mc.embedding_dim, visual, textual)
        except BackendUnavailableError as exc:
            for s in sessions:
                s.close()
            if (
                isinstance(exc, CanaryFailedError)
                and exc.kept
                and (plan, exc.kept) not in recompiled  # once per file: never a loop
                and forget_compiled(plan, exc.kept, settings.model_digest)
            ):
                recompiled.append((plan, exc.kept))
                queue.insert(0, plan)  # once more, compiled afresh: a kept file may be damaged
                continue
            failures.append(str(exc))
            if isinstance(exc, CanaryFailedError) or (
                forced is not InferencePrecision.AUTO and plan.backend is BackendType.OPENVINO
            ):  # a refusal, or the precision the user forced cannot run: said, not only logged
                refused.append(str(exc))
            log.warning("backend %s unusable: %s", plan.describe(), exc)
            continue
        except BaseException:
            for s in sessions:
                s.close()
            raise
        if plan.note:
            log.warning("%s", plan.note)
        break
    else:
        reasons = dict.fromkeys(failures)  # each reason once (a device missing for every precision)
        raise BackendUnavailableError("; ".join(reasons) or "no execution provider usable")
    # A precision variant is another embedding space (its vectors differ slightly): its id and
    # digest say so, and an index built with the fp32 variant refuses its int8 twin's vectors.
    identity = ModelIdentity.of_variant(
        name=spec.name, sha256=digest, embedding_dim=dim, variant=spec.variant
    )
    log.info(
        "model %s ready: dim %d, image %d px, backend %s, text tower %s",
        identity.model_id,
        dim,
        image_spec.image_size,
        visual.session.backend.value,
        "yes" if textual else ("on first use" if open_textual else "no"),
    )
    model = ClipModel(
        spec=spec,
        identity=identity,
        visual=visual,
        textual=textual,
        preprocessor=preprocessor,
        config=config,
        textual_loader=open_textual if lazy_textual else None,
        precision=plan.precision,
        canary=cosines,
        refused=tuple(refused),
    )
    model.loading_note = note
    return model


def _refusal(
    plan: ProviderPlan, tower: VisualTower | TextualTower, cosine: float, floor: float
) -> str:
    name = "visual" if isinstance(tower, VisualTower) else "textual"
    return (
        f"{plan.describe()} refused by the canary: {name} tower's min cosine to cpu f32 is "
        f"{cosine:.10g}, below canary_min_cosine {floor!r}"
    )


class CanaryFailedError(BackendUnavailableError):
    """A provider's embeddings are too far from CPU fp32's (AUTO moves on; explicit fails).

    ``kept``: the session came from the start-up cache (a kept file may be damaged)."""

    def __init__(self, message: str, *, kept: Path | None = None) -> None:
        super().__init__(message)
        self.kept = kept


def _textual_opener(
    spec: ModelSpec,
    config: PluginConfig,
    plan: ProviderPlan,
    settings: SessionSettings,
    session_factory: Callable[..., ORTSession],
    path: Path,
    mode: str,
    canary: Callable[[VisualTower | TextualTower, ProviderPlan, Path, str], float],
    cosines: dict[str, float],
) -> Callable[[], TextualTower]:
    """Opens the text tower on ``plan`` (now, or on first use) and runs its canary there."""
    assert spec.textual_path is not None
    assert spec.tokenizer_path is not None
    textual_path, tokenizer_path = spec.textual_path, spec.tokenizer_path

    def open_textual() -> TextualTower:
        tokenizer = make_tokenizer(
            tokenizer_path, spec.text, context_length=spec.context_length, pad_id=spec.pad_id
        )
        text_session = session_factory(
            path, plan, settings, loading_mode=mode, name=textual_path.name
        )
        try:
            tower = TextualTower(
                text_session,
                tokenizer,
                config.max_batch_size,
                declared_mask=spec.text.attention_mask,
                pooler_is_embedding=spec.pooler_is_embedding,
            )
            if plan.needs_canary:
                cosines["textual"] = canary(tower, plan, path, mode)
            return tower
        except BaseException:
            text_session.close()
            raise

    return open_textual


def session_settings(config: PluginConfig) -> SessionSettings:
    """The ONNX Runtime session settings ``config`` asks for (every model it opens shares them)."""
    return SessionSettings(
        intra_op_threads=config.intra_op_threads,
        device_id=config.device_id,
        tensorrt_cache_dir=config.tensorrt.cache_dir,
        tensorrt_fp16=config.tensorrt.fp16,
        optimization_level=config.session.optimization_level,
        optimized_cache_dir=config.session.optimized_model_cache_dir,
        cpu_mem_arena=config.session.cpu_mem_arena,
        allow_spinning=config.session.allow_spinning,
        run_timeout_s=config.session.run_timeout_s,
        openvino_device=config.openvino.device,
        openvino_precision=config.openvino.precision,
    )


def load_ocr(config: PluginConfig, *, budget: PixelBudget | None = None) -> OCREngine:
    """The OCR engine of ``config.ocr`` on ``config``'s backend and session settings, with its
    decode limit (so OCR runs where embedding does, within the same limits).

    Raises:
        ModelNotFoundError, ModelFormatError, BackendUnavailableError: as
        :meth:`OCREngine.load`, the message naming the OCR model.
    """
    backend = config.backend if config.backend is not BackendType.AUTO else auto_backend()
    try:
        return OCREngine.load(
            config.ocr,
            backend=backend,
            settings=session_settings(config),
            available=[] if backend is BackendType.CPU else None,
            max_image_pixels=config.preprocess.max_image_pixels,
            budget=budget,
        )
    except (ModelError, BackendUnavailableError) as exc:  # said apart from the CLIP model's
        raise type(exc)(f"the OCR model (ocr.models): {exc}") from exc


def declared_preprocessor(
    config: PluginConfig, *, spec: ModelSpec | None = None, budget: PixelBudget | None = None
) -> ImagePreprocessor | None:
    """The image preprocessing :func:`load_model` gives ``config``'s model (or the model
    ``spec`` describes: a loaded one's ``plugin.model_spec``), where it is known without opening
    a session: the model's files declare its input size (our layout, Immich's,
    transformers.js') or the configuration sets it. A caller can then decode its first images
    while the session opens (``themis-clip index``); the loaded model's preprocessor compares
    equal. None where only the graph tells (its fixed input size), and None for a model that is
    not on disk or cannot be resolved: :func:`load_model` reports that.
    """
    try:
        if spec is None:
            _, spec = _resolve(config, allow_download=False)
        if _declares_size(spec) or config.preprocess.image_size is not None:
            return _preprocessor(spec, config, _configured_image_spec(spec, config), budget)
    except ThemisClipError:
        pass  # load_model raises it, with its full context
    return None


def _resolve(
    config: PluginConfig, *, allow_download: bool = True
) -> tuple[ResolvedModel, ModelSpec]:
    mc = config.model
    # A path, Hub repo id or catalogue name → a local, verified model (models/hub.py).
    local = resolve_source(mc.path, precision=mc.variant, allow_download=allow_download)
    spec = resolve_model(
        local.path,
        name=mc.name or (local.source.label if local.source.repo else None),
        text_path=mc.text_path or local.text_path,
        tokenizer_path=mc.tokenizer_path,
        variant=mc.variant,
    )
    if local.digests:  # from the Hub: only files its verified record holds (the rest is unknown)
        given = {Path(p) for p in (mc.text_path, mc.tokenizer_path) if p}
        for file in (spec.visual_path, spec.textual_path, spec.tokenizer_path):
            if file is not None and file not in given and str(file) not in local.digests:
                raise ModelFormatError(
                    f"{local.source.label}: {file} is not a file of its verified Hub record "
                    f"(commit {local.commit}); a model from the Hub loads only verified files"
                )
    return local, spec


def _preprocessor(
    spec: ModelSpec, config: PluginConfig, image: ImageSpec, budget: PixelBudget | None
) -> ImagePreprocessor:
    try:
        return ImagePreprocessor(
            image,
            apply_exif=config.preprocess.apply_exif,
            max_image_pixels=config.preprocess.max_image_pixels,
            decode_mode=config.preprocess.decode_mode,
            budget=budget,
        )
    except ValueError as exc:
        raise ModelFormatError(f"{spec.root}: {exc}") from exc


def _session_source(
    path: Path, mmap: bool, cache_dir: str | None, hash_fn: HashFunction
) -> tuple[Path, str, str | None]:
    """What ONNX Runtime should load for ``path``: ``(file, loading mode, fallback reason)``."""
    if not mmap:
        return path, LoadingMode.PATH, None
    cache_root = Path(cache_dir) if cache_dir else path.parent / ".themis-mmap"
    try:
        return mapped_model(path, hash_fn(path), cache_root), LoadingMode.MMAP, None
    except MappingUnavailable as exc:
        reason = f"memory-mapped loading unavailable for {path.name}, loaded from path: {exc}"
        log.warning("%s", reason)
        return path, LoadingMode.PATH, reason


def _resolve_dim(
    spec: ModelSpec, declared: int | None, visual: VisualTower, textual: TextualTower | None
) -> int:
    graph_dims = {d for d in (visual.output_dim, textual.output_dim if textual else None) if d}
    if len(graph_dims) > 1:
        raise ModelMismatchError(
            f"image and text towers disagree on the embedding dimension: {sorted(graph_dims)}"
        )
    graph_dim = graph_dims.pop() if graph_dims else None
    probe_dim = graph_dim
    if probe_dim is None:  # dynamic output axis: run one zero input to learn it
        size = visual.graph_image_size or spec.image.image_size
        out = visual.run(np.zeros((1, 3, size, size), dtype=np.float32))
        probe_dim = int(out.shape[1])
    for source, value in (
        ("model.embedding_dim", declared),
        ("manifest embedding_dim", spec.embedding_dim),
    ):
        if value is not None and value != probe_dim:
            raise ModelMismatchError(
                f"{source} is {value} but the model outputs {probe_dim}-dimensional embeddings"
            )
    return probe_dim


def _declares_size(spec: ModelSpec) -> bool:
    return spec.layout in (Layout.THEMIS, Layout.IMMICH, Layout.TRANSFORMERS_JS)


def _configured_image_spec(
    spec: ModelSpec, config: PluginConfig, graph_size: int | None = None
) -> ImageSpec:
    """The model's image specification with the configuration's overrides; ``graph_size`` (the
    image tower's fixed input side) counts only for a layout that does not declare its own."""
    pre = config.preprocess
    image = spec.image
    if not _declares_size(spec) and graph_size and pre.image_size is None:
        image = replace(image, image_size=graph_size)
    return replace(
        image,
        image_size=pre.image_size or image.image_size,
        mean=pre.mean or image.mean,
        std=pre.std or image.std,
        resize_mode=pre.resize_mode or image.resize_mode,
    )


def _resolve_image_spec(spec: ModelSpec, config: PluginConfig, visual: VisualTower) -> ImageSpec:
    image = _configured_image_spec(spec, config, visual.graph_image_size)
    if visual.graph_image_size and visual.graph_image_size != image.image_size:
        where = (
            "the config's preprocess.image_size"
            if config.preprocess.image_size
            else "the model's files, or the default where they declare none"
        )
        raise ModelMismatchError(
            f"image size {image.image_size} (from {where}) does not match the image tower's "
            f"fixed input {visual.graph_image_size}x{visual.graph_image_size}; set "
            "preprocess.image_size to match"
        )
    return image
