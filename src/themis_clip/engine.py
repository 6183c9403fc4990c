"""The two towers and the loaded model (the seed's ``Impl``): pre / core / post steps.

Input and output names, dtypes and batch axes are read from each session, never hard-coded:
an image tower takes one float tensor ``[N, 3, S, S]`` and returns ``[N, D]``; a text tower takes
integer ids ``[N, L]`` (int32 or int64) and optionally an attention mask, and returns ``[N, D]``.
Graphs whose batch axis is fixed at 1 are looped; graphs with a dynamic sequence axis get
batches trimmed to their longest real sequence (the text tower pools at EOT under a causal mask,
so trailing padding cannot change the result). Outputs are always L2-normalised here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from themis_clip.config import PluginConfig
from themis_clip.errors import (
    InferenceError,
    ModelFormatError,
)
from themis_clip.interface import BackendType
from themis_clip.models.spec import ModelSpec
from themis_clip.preprocess.image import ImagePreprocessor
from themis_clip.preprocess.text import CLIPTokenizer, HFTokenizer
from themis_clip.runtime import (
    ORTSession,
)
from themis_clip.vocabulary import InferencePrecision, ModelIdentity

__all__ = ["ClipModel", "TextualTower", "VisualTower", "l2_normalize"]

log = logging.getLogger(__name__)

_IMAGE_OUTPUT_NAMES = (
    "image_embeds",
    "embedding",
    "IMAGE_EMBEDDING",
    "image_embedding",
    "embeddings",
)
_TEXT_OUTPUT_NAMES = ("text_embeds", "embedding", "TEXT_EMBEDDING", "text_embedding", "embeddings")
_TEXT_INPUT_NAMES = ("input_ids", "text", "TEXT", "tokens")
_MASK_NAMES = ("attention_mask", "mask")


def l2_normalize(x: npt.NDArray[Any]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """Normalise rows to unit L2 norm.

    Returns:
        ``(normalised float32 [n, D], valid bool [n])``; a row is invalid when it holds a
        non-finite value or has zero norm (it cannot be normalised), and is left as zeros.
    """
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    valid = np.isfinite(norms) & (norms > 0)
    out = np.zeros_like(x, dtype=np.float32)
    out[valid] = x[valid] / norms[valid, None].astype(np.float32)
    return out, valid


def _pick_output(session: ORTSession, preferred: Sequence[str]) -> int:
    names = [o.name for o in session.outputs]
    for name in preferred:
        if name in names:
            return names.index(name)
    return 0


_TOWER_ONLY_OUTPUTS = frozenset({"last_hidden_state", "pooler_output"})


def _check_embedding_output(
    session: ORTSession, index: int, tower: str, pooler_is_embedding: bool = False
) -> int | None:
    out = session.outputs[index]
    if out.name in _TOWER_ONLY_OUTPUTS and not (
        pooler_is_embedding and out.name == "pooler_output"
    ):
        raise ModelFormatError(
            f"{tower} tower {session.name} outputs {', '.join(o.name for o in session.outputs)}: "
            "a tower-only export (e.g. optimum's clip_vision_model) without the projection "
            "gives no CLIP embeddings; export the full model with `themis-clip export`"
        )
    if len(out.shape) == 3:
        raise ModelFormatError(
            f"{tower} tower {session.name} outputs {out.name} of rank 3 {out.shape}: this "
            "looks like a tower-only export (hidden states) without the projection, which gives "
            "no CLIP embeddings; export the full model with `themis-clip export`"
        )
    if len(out.shape) != 2:
        raise ModelFormatError(
            f"{tower} tower output {out.name} must be [batch, dim], got shape {out.shape}"
        )
    return out.fixed_dim(1)


class VisualTower:
    """Image tower: ``pixels [N, 3, S, S]`` → ``embeddings [N, D]`` (not yet normalised)."""

    def __init__(
        self, session: ORTSession, max_batch_size: int, *, pooler_is_embedding: bool = False
    ) -> None:
        floats = [i for i in session.inputs if i.dtype.kind == "f"]
        if len(session.inputs) != 1 or not floats or len(floats[0].shape) != 4:
            described = ", ".join(f"{i.name}{list(i.shape)} {i.dtype}" for i in session.inputs)
            raise ModelFormatError(
                f"image tower {session.name} must take one float tensor [N, 3, S, S]; it "
                f"takes {described} (a joint text+image model? use separate towers)"
            )
        self.session = session
        self.input = floats[0]
        names = _IMAGE_OUTPUT_NAMES + (("pooler_output",) if pooler_is_embedding else ())
        self._output_index = _pick_output(session, names)
        self.output_dim = _check_embedding_output(
            session, self._output_index, "image", pooler_is_embedding
        )
        self._output_name = session.outputs[self._output_index].name
        fixed_batch = self.input.fixed_dim(0)
        self.batch_limit = min(max_batch_size, fixed_batch) if fixed_batch else max_batch_size
        self.fixed_batch = fixed_batch
        self.graph_image_size = self.input.fixed_dim(2)

    def run(self, pixels: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Embed ``pixels`` ``[n, 3, S, S]`` in chunks the graph accepts."""
        if pixels.dtype != self.input.dtype:
            pixels = pixels.astype(self.input.dtype)
        chunks = []
        step = self.fixed_batch or self.batch_limit
        for start in range(0, len(pixels), step):
            chunk = pixels[start : start + step]
            (out,) = self.session.run([self._output_name], {self.input.name: chunk})
            chunks.append(np.asarray(out, dtype=np.float32))
        result = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
        return _check_shape(result, len(pixels), self.session)


class TextualTower:
    """Text tower: token ids ``[N, L]`` (+ mask) → ``embeddings [N, D]`` (not yet normalised)."""

    def __init__(
        self,
        session: ORTSession,
        tokenizer: CLIPTokenizer | HFTokenizer,
        max_batch_size: int,
        *,
        declared_mask: bool | None = None,
        pooler_is_embedding: bool = False,
    ) -> None:
        ints = [i for i in session.inputs if i.dtype.kind in "iu"]
        ids = next((i for i in ints if i.name in _TEXT_INPUT_NAMES), None)
        if ids is None and ints:
            ids = next((i for i in ints if i.name not in _MASK_NAMES), None)
        if ids is None or len(ids.shape) != 2:
            raise ModelFormatError(
                f"text tower {session.name} must take integer token ids [N, L]; it takes "
                + ", ".join(f"{i.name}{list(i.shape)} {i.dtype}" for i in session.inputs)
            )
        self.ids = ids
        self.mask = next((i for i in ints if i.name in _MASK_NAMES), None)
        if declared_mask is True and self.mask is None:
            raise ModelFormatError(
                f"the model declares that its text tower takes an attention mask, but "
                f"{session.name} has no mask input (inputs: "
                + ", ".join(i.name for i in session.inputs)
                + ")"
            )
        if declared_mask is False and self.mask is not None:
            raise ModelFormatError(
                f"the model declares a text tower without an attention mask, but {session.name} "
                f"takes {self.mask.name!r}"
            )
        others = [i.name for i in session.inputs if i is not ids and i is not self.mask]
        if others:
            raise ModelFormatError(
                f"text tower {session.name} needs inputs we cannot provide: {others} "
                "(a joint text+image model? use separate towers)"
            )
        self.session = session
        self.tokenizer = tokenizer
        names = _TEXT_OUTPUT_NAMES + (("pooler_output",) if pooler_is_embedding else ())
        self._output_index = _pick_output(session, names)
        self.output_dim = _check_embedding_output(
            session, self._output_index, "text", pooler_is_embedding
        )
        self._output_name = session.outputs[self._output_index].name
        self.fixed_batch = ids.fixed_dim(0)
        self.fixed_length = ids.fixed_dim(1)
        self.batch_limit = (
            min(max_batch_size, self.fixed_batch) if self.fixed_batch else max_batch_size
        )
        if self.fixed_length is not None and self.fixed_length < tokenizer.context_length:
            # The graph is the authority: sequences must fit its fixed axis.
            tokenizer.context_length = self.fixed_length

    def describe(self) -> dict[str, Any]:
        """How the text tower is fed: context length, attention mask, fixed axes."""
        return {
            "context_length": self.tokenizer.context_length,
            "attention_mask": self.mask is not None,
            "fixed_length": self.fixed_length,
            "fixed_batch": self.fixed_batch,
        }

    def run(self, rows: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        """Embed token rows; batches are length-sorted, trimmed, and returned in input order."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        result: npt.NDArray[np.float32] | None = None
        step = self.fixed_batch or self.batch_limit
        for start in range(0, len(order), step):
            idx = order[start : start + step]
            chunk = [rows[i] for i in idx]
            if self.fixed_length:
                length = self.fixed_length
            elif self.tokenizer.pad_to_context:  # last-token pooling: the trained length
                length = self.tokenizer.context_length
            else:
                length = max(len(r) for r in chunk)
            ids, mask = self.tokenizer.pad(chunk, length, self.ids.dtype)
            feeds = {self.ids.name: ids}
            if self.mask is not None:
                feeds[self.mask.name] = mask.astype(self.mask.dtype)
            (out,) = self.session.run([self._output_name], feeds)
            out = _check_shape(np.asarray(out, dtype=np.float32), len(chunk), self.session)
            if result is None:
                result = np.empty((len(rows), out.shape[1]), dtype=np.float32)
            result[idx] = out
        assert result is not None, "run() needs at least one row"
        return result


def _check_shape(
    out: npt.NDArray[np.float32], n: int, session: ORTSession
) -> npt.NDArray[np.float32]:
    if out.ndim != 2 or out.shape[0] != n:
        raise InferenceError(
            f"{session.name} returned shape {out.shape}, expected [{n}, embedding_dim]"
        )
    return out


class ClipModel:
    """A loaded model: sessions, tokenizer, preprocessor, identity and in-flight counting.

    This is the seed's ``Impl``: the plugin holds exactly one active ``ClipModel`` and swaps it
    whole on reload. Requests hold it through :meth:`acquire`/:meth:`release`; :meth:`close`
    releases sessions as soon as no request holds the model any more.
    """

    def __init__(
        self,
        *,
        spec: ModelSpec,
        identity: ModelIdentity,
        visual: VisualTower,
        textual: TextualTower | None,
        preprocessor: ImagePreprocessor,
        config: PluginConfig,
        textual_loader: Callable[[], TextualTower] | None = None,
        precision: InferencePrecision = InferencePrecision.F32,
        canary: dict[str, float] | None = None,
        refused: tuple[str, ...] = (),
    ) -> None:
        self.spec = spec
        self.identity = identity
        self.visual = visual
        self._textual = textual
        # A lazy text tower (image-only callers such as ``index`` never pay for it): opened on
        # the first access of ``textual``, under ``_textual_lock``.
        self._textual_loader = textual_loader if textual is None else None
        self._textual_lock = threading.Lock()
        self.preprocessor = preprocessor
        self.config = config
        self.backend: BackendType = visual.session.backend
        self.providers = visual.session.providers
        self.precision = precision
        # the canary's min cosine to CPU fp32 per tower (a lazy text tower adds its own when
        # it opens); empty on the CPU provider in fp32, which is the reference
        self.canary = canary if canary is not None else {}
        self.refused = refused
        self.generation = 0
        self.loading_note: str | None = None
        self._in_flight = 0
        self._retired = False
        self._closed = False
        self._cond = threading.Condition()

    @property
    def textual(self) -> TextualTower | None:
        """The text tower (None if the model has none); a lazy one is opened here, once."""
        if self._textual is None and self._textual_loader is not None:
            with self._textual_lock:
                loader = self._textual_loader
                if self._textual is None and loader is not None and not self._closed:
                    self._textual = loader()
                    self._textual_loader = None
                    log.info("text tower of %s opened on first use", self.identity.model_id)
        return self._textual

    @property
    def has_textual(self) -> bool:
        """Whether the model has a text tower, opened or not (opens nothing)."""
        return self._textual is not None or self._textual_loader is not None

    @property
    def embedding_dim(self) -> int:
        return self.identity.embedding_dim

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    @property
    def closed(self) -> bool:
        return self._closed

    # -- loading ------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What the model says about itself in the plugin's statistics."""
        return {
            "backend": self.backend.value,
            "providers": list(self.providers),
            "precision": self.precision.value,
            "canary": {
                "floor": self.config.canary_min_cosine,
                "min_cosine": dict(self.canary),
                "refused": list(self.refused),
            },
            "model_variant": self.identity.name,
            "model_id": self.identity.model_id,
            "model_sha256": self.identity.sha256,
            "precision_variant": self.spec.variant,
            "embedding_dim": self.embedding_dim,
            "image_size": self.preprocessor.spec.image_size,
            "text_tower": self.has_textual,
            "text_input": self._textual.describe() if self._textual is not None else None,
            "generation": self.generation,
            "in_flight": self.in_flight,
            "loading_mode": self.visual.session.loading_mode.value,
            "loading_note": self.loading_note,
            "optimized_model_cache": {
                tower: t.session.optimized_cache
                for tower, t in (("visual", self.visual), ("textual", self._textual))
                if t is not None
            },
        }

    # -- in-flight accounting ------------------------------------------------------------------

    def acquire(self) -> bool:
        """Count a request in; False if the model is already closed."""
        with self._cond:
            if self._closed:
                return False
            self._in_flight += 1
            return True

    def release(self) -> None:
        """Count a request out; the last one out of a retired model closes it."""
        with self._cond:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._cond.notify_all()
                if self._retired:
                    self._close_locked()

    def retire(self, timeout_s: float) -> bool:
        """Stop serving: wait up to ``timeout_s`` for in-flight requests, then release sessions.

        Returns:
            True if drained in time and closed now; False if requests were still running: their
            session runs are stopped then (a model that never finishes cannot hold a reload or
            a shutdown), and the last of them closes the model as it returns.
        """
        with self._cond:
            self._retired = True
            drained = self._cond.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)
            if drained:
                self._close_locked()
                return True
        self.stop_runs(f"the model was retired with runs in flight after {timeout_s:g} s")
        return False

    def stop_runs(self, reason: str) -> None:
        """Stop both towers' session runs in flight (each fails with ``reason``)."""
        self.visual.session.stop_runs(reason)
        if self._textual is not None:
            self._textual.session.stop_runs(reason)

    def _close_locked(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.visual.session.close()
        with self._textual_lock:
            self._textual_loader = None
            if self._textual is not None:
                self._textual.session.close()
        log.info("model %s (generation %d) released", self.identity.model_id, self.generation)

    # -- inference -----------------------------------------------------------------------------

    def embed_pixels(
        self, pixels: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """Run the image tower and normalise; returns ``(embeddings [n, D], valid [n])``."""
        return l2_normalize(self._check_dim(self.visual.run(pixels)))

    def embed_token_rows(
        self, rows: Sequence[Sequence[int]]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """Run the text tower on token rows and normalise."""
        if self.textual is None:
            raise ModelFormatError(f"model {self.identity.name} has no text tower")
        return l2_normalize(self._check_dim(self.textual.run(rows)))

    def _check_dim(self, out: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if out.shape[1] != self.identity.embedding_dim:
            raise InferenceError(
                f"model {self.identity.model_id} returned {out.shape[1]}-dimensional embeddings, "
                f"expected {self.identity.embedding_dim}"
            )
        return out
