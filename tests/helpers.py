"""Shared test helpers: tiny model directories, images in every mode, an independent reference."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from themis_clip import CLIP_MEAN, CLIP_STD, ModelConfig, OnnxClipPlugin, PluginConfig
from themis_clip.runtime import ORTSession, create_session

MEAN = np.asarray(CLIP_MEAN, dtype=np.float64)
STD = np.asarray(CLIP_STD, dtype=np.float64)


def reference_clip_transform(img: Image.Image, n_px: int = 224) -> np.ndarray:
    """OpenAI CLIP ``_transform(n_px)`` written out from torchvision's documented semantics.

    Resize(n_px, BICUBIC) on the shortest side with the long side truncated, CenterCrop with
    ``int(round((L - n_px) / 2.0))`` offsets, convert("RGB"), ToTensor, Normalize. Computed in
    float64 so it checks our float32 fast path rather than repeating it.
    """
    w, h = img.size
    if w <= h:
        new_w, new_h = n_px, int(n_px * h / w)
    else:
        new_w, new_h = int(n_px * w / h), n_px
    if (new_w, new_h) != (w, h):
        img = img.resize((new_w, new_h), Image.BICUBIC)
    top = int(round((new_h - n_px) / 2.0))  # noqa: RUF046 - torchvision's exact expression
    left = int(round((new_w - n_px) / 2.0))  # noqa: RUF046
    img = img.crop((left, top, left + n_px, top + n_px)).convert("RGB")
    x = np.asarray(img, dtype=np.float64) / 255.0
    return ((x - MEAN) / STD).transpose(2, 0, 1)


def photo_like(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth-plus-noise RGB uint8 array (not flat colour, so resampling errors show)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack(
        [128 + 100 * np.sin(xx / (7 + seed) + c) * np.cos(yy / (11 + c + seed)) for c in range(3)],
        axis=-1,
    )
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def encode(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


class SessionRecorder:
    """A ``session_factory`` that creates real sessions and keeps them, so a test can watch or
    fault one through the plugin's public constructor argument."""

    def __init__(self) -> None:
        self.sessions: list[ORTSession] = []

    def __call__(self, path: Path, plan: Any, settings: Any, **kw: Any) -> ORTSession:
        session = create_session(path, plan, settings, **kw)
        self.sessions.append(session)
        return session

    def last(self, tower: str) -> ORTSession:
        """The newest session whose file name contains ``tower`` ("visual", "textual")."""
        return next(s for s in reversed(self.sessions) if tower in s.path.name)


def make_plugin(
    model_dir: Path, *, session_factory: Any = None, **config: object
) -> OnnxClipPlugin:
    plugin = OnnxClipPlugin(session_factory=session_factory or create_session)
    model_keys = {k: config.pop(k) for k in list(config) if k in ModelConfig.__dataclass_fields__}
    cfg = PluginConfig(model=ModelConfig(path=str(model_dir), **model_keys), **config)  # type: ignore[arg-type]
    assert plugin.initialize(cfg), plugin.last_error
    return plugin


def wait_ready(base: str, proc: subprocess.Popen[Any], timeout_s: float = 60) -> None:
    """Poll ``/readyz`` until the server subprocess is ready (or fail with its stderr)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError("server never became ready")
        time.sleep(0.2)


class ServerProcess:
    """A real ``themis-clip serve`` subprocess on a port it chose itself (``--port 0``).

    The server prints ``listening on http://HOST:PORT`` once bound; nothing races for the
    port between choosing and binding it. Use as a context manager: SIGTERM, then kill.
    """

    def __init__(
        self, args: list[str], *, env: dict[str, str] | None = None, ready: bool = True
    ) -> None:
        import os
        import subprocess
        import sys
        from pathlib import Path

        exe = str(Path(sys.executable).parent / "themis-clip")
        if "--index" in args and "--new-index" not in args:
            args = [*args, "--new-index"]  # tests name indexes they fill over HTTP
        self.proc = subprocess.Popen(
            [exe, "serve", "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.base = self._read_address()
        self.log: list[str] = []
        import threading

        assert self.proc.stderr is not None
        stream = self.proc.stderr
        # Keep reading the server's stderr so that its logging can never fill the pipe.
        threading.Thread(target=lambda: self.log.extend(stream), daemon=True).start()
        if ready:
            wait_ready(self.base, self.proc)

    def _read_address(self, timeout_s: float = 60) -> str:
        import selectors

        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout_s
        seen = []
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stderr, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                line = self.proc.stderr.readline()
                if not line:
                    break
                seen.append(line)
                if "listening on " in line:
                    return line.split("listening on ", 1)[1].strip()
        self.proc.kill()
        raise AssertionError("server did not report its address: " + "".join(seen)[-2000:])

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def err(r: httpx.Response, status: int, kind: str | None = None) -> str:
    """The message of a documented JSON error answer, after checking its status and type."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()  # always the documented JSON error
    if kind is not None:
        assert body["error"]["type"] == kind, body
    return str(body["error"]["message"])


def hwm_mb(pid: int) -> int:
    """A process's peak resident memory (VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def reset_hwm(pid: int) -> None:
    """Reset a process's peak resident memory to its current size."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def new_key(keys: Path, scope: str, name: str) -> str:
    """A new API key from ``themis-clip keys create`` (printed alone on its last line)."""
    exe = str(Path(sys.executable).with_name("themis-clip"))
    done = subprocess.run(
        [exe, "keys", "create", "--keys", str(keys), "--scope", scope, "--name", name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


#: a text that drives :data:`BACKTRACKING_SPLIT` into onig's retry limit (a Rust panic)
HOSTILE_TEXT = "§" + "a" * 40 + "!"
#: a pre-tokenizer pattern that matches plain text at once (the load's probes pass) and
#: backtracks catastrophically on :data:`HOSTILE_TEXT`
BACKTRACKING_SPLIT = r"[^§]+|§(\w+\s?)+$"
#: a pattern that backtracks catastrophically on plain text (``aaaa…!``): refused at load
PATHOLOGICAL_SPLIT = r"(\w+\s?)+$"


def hostile_tokenizer_model(
    model_dir: Path, dst: Path, *, pattern: str = BACKTRACKING_SPLIT
) -> Path:
    """A copy of ``model_dir`` whose ``tokenizer.json`` splits with ``pattern`` (its manifest
    re-hashed, so it loads as an honest model would)."""
    import hashlib
    import json
    import shutil

    shutil.copytree(model_dir, dst)
    tokenizer = json.loads((dst / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
    data = json.dumps(tokenizer).encode()
    (dst / "tokenizer.json").write_bytes(data)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["files"]["tokenizer.json"] = hashlib.sha256(data).hexdigest()
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def endless_model(model_dir: Path, dst: Path, *, trips: int = 2**62) -> Path:
    """A copy of ``model_dir`` whose image tower ends in a ``Loop`` of ``trips`` iterations
    (the default never finishes); its manifest re-hashed, so it loads and serves."""
    import hashlib
    import json
    import shutil

    from onnx import TensorProto, helper, numpy_helper

    shutil.copytree(model_dir, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    dim, size = manifest["embedding_dim"], manifest["visual"]["image_size"]
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["x_in"], ["x_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", TensorProto.FLOAT, None),
        ],
    )
    weights = np.random.default_rng(0).standard_normal((3, dim)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["pixel_values"], ["mean"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["mean", "w"], ["embeds"]),
            helper.make_node("Loop", ["trips", "cond", "embeds"], ["image_embeds"], body=body),
        ],
        "endless",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, ["N", dim])],
        [
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(np.array(trips, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "cond"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    (dst / "visual.onnx").write_bytes(data)
    manifest["files"]["visual.onnx"] = hashlib.sha256(data).hexdigest()
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst
