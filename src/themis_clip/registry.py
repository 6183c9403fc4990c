"""Plugin registration (the seed's ``THEMIS_IMAGE_PLUGIN``) through entry points.

A package registers a backend under the group ``themis.image_plugins``::

    [project.entry-points."themis.image_plugins"]
    my_backend = "my_package.module:MyBackend"

where ``MyBackend`` subclasses :class:`~themis_clip.interface.ImageAnalysisBackend`. This
package registers ``onnx_clip``.

ThemisDB's entry points have Python spellings here: ``themis_create_image_plugin`` is
:func:`create_image_plugin`, ``themis_destroy_image_plugin`` is :func:`destroy_image_plugin`,
``themis_get_image_plugin_api_version`` is :func:`get_image_plugin_api_version`. A backend
declares the API it was written against in ``plugin_api_version`` (inherited from the base
class: ``THEMIS_IMAGE_PLUGIN_API_VERSION``); :func:`load_backend` refuses another major version.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from themis_clip.errors import PluginAPIVersionError, PluginNotFoundError
from themis_clip.interface import THEMIS_IMAGE_PLUGIN_API_VERSION, ImageAnalysisBackend

__all__ = [
    "ENTRY_POINT_GROUP",
    "available_backends",
    "create_image_plugin",
    "destroy_image_plugin",
    "get_image_plugin_api_version",
    "load_backend",
]

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
    _check_api_version(name, getattr(cls, "plugin_api_version", None))
    return cls()


def get_image_plugin_api_version() -> str:
    """ThemisDB's ``themis_get_image_plugin_api_version``: the API this package implements."""
    return THEMIS_IMAGE_PLUGIN_API_VERSION


def create_image_plugin(name: str = "onnx_clip") -> ImageAnalysisBackend:
    """ThemisDB's ``themis_create_image_plugin``: a new, uninitialised backend."""
    return load_backend(name)


def destroy_image_plugin(plugin: ImageAnalysisBackend) -> None:
    """ThemisDB's ``themis_destroy_image_plugin``: release everything the backend holds."""
    plugin.shutdown()


def _major(version: object) -> str | None:
    if not isinstance(version, str) or not version.split(".")[0].isdigit():
        return None
    return version.split(".")[0]


def _check_api_version(name: str, version: object) -> None:
    ours = THEMIS_IMAGE_PLUGIN_API_VERSION
    if _major(version) is None or _major(version) != _major(ours):
        raise PluginAPIVersionError(
            f"image plugin {name!r} implements plugin API {version!r}, this host speaks {ours} "
            f"(major version {_major(ours)}); use a build of the plugin for API {ours}"
        )
