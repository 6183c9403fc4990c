"""``python -m themis_clip.cli``."""

from themis_clip.cli import entry

entry()
