"""One rule for optional extras at the CLI edge: a missing one is one error naming its install.

Commands import what an extra brings where they need it; an ``ImportError`` of one of the
modules below reaching :func:`themis_clip.cli.main` becomes ``themis-clip: error: <command>
needs the <extra> extra (<module> is missing): pip install 'themis-onnx-clip[<extra>]'`` and
exit code 2, never a traceback.
"""

from __future__ import annotations

__all__ = ["EXTRA_OF", "missing_extra"]

#: top-level module → the extra of ``pyproject.toml`` that installs it
EXTRA_OF: dict[str, str] = {
    "fastapi": "server",
    "hypercorn": "server",
    "orjson": "server",
    "prometheus_client": "server",
    "multipart": "server",
    "python_multipart": "server",
    "starlette": "server",
    "ray": "ray",
    "pyarrow": "ray",
    "pandas": "ray",
    "torch": "export",
    "onnxscript": "export",
    "transformers": "export",
    "onnx": "export",  # also the mmap extra's one module; export is the superset
    "psycopg": "postgres",
    "psycopg_binary": "postgres",
    "pgvector": "postgres",
}


def missing_extra(exc: ImportError, command: str) -> str | None:
    """The message for an ``ImportError`` of an extra's module, or None for any other."""
    name = (exc.name or "").split(".")[0]
    extra = EXTRA_OF.get(name)
    if extra is None:
        return None
    return (
        f"{command} needs the {extra} extra ({name} is missing): "
        f"pip install 'themis-onnx-clip[{extra}]'"
    )
