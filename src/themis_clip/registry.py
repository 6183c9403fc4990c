"""Plugin registration (the seed's ``THEMIS_IMAGE_PLUGIN``) through entry points.

A package registers a backend under the group ``themis.image_plugins``::

    [project.entry-points."themis.image_plugins"]
    my_backend = "my_package.module:MyBackend"

where ``MyBackend`` subclasses :class:`~themis_clip.interface.ImageAnalysisBackend`. This
package registers ``onnx_clip``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from themis_clip.errors import PluginNotFoundError
from themis_clip.interface import ImageAnalysisBackend

__all__ = ["ENTRY_POINT_GROUP", "available_backends", "load_backend"]

ENTRY_POINT_GROUP = "themis.image_plugins"
# Found even when running from a source tree that was never installed.
_BUILTIN = {"onnx_clip": "themis_clip.plugin:OnnxClipPlugin"}


def available_backends() -> list[str]:
    """Names of every registered image-analysis backend, sorted."""
    names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names | set(_BUILTIN))


def load_backend(name: str) -> ImageAnalysisBackend:
    """Instantiate the backend registered as ``name``.

    Raises:
        PluginNotFoundError: nothing is registered under ``name``, it fails to import, or
            it is not an ``ImageAnalysisBackend``.
    """
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    try:
        if matches:
            cls = matches[0].load()
        elif name in _BUILTIN:
            module, _, attr = _BUILTIN[name].partition(":")
            cls = getattr(importlib.import_module(module), attr)
        else:
            known = ", ".join(available_backends())
            raise PluginNotFoundError(f"no image plugin named {name!r} (registered: {known})")
    except (ImportError, AttributeError) as exc:
        raise PluginNotFoundError(f"image plugin {name!r} failed to load: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, ImageAnalysisBackend)):
        raise PluginNotFoundError(
            f"image plugin {name!r} is {cls!r}, not an ImageAnalysisBackend subclass"
        )
    return cls()
