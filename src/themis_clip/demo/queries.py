"""The demo's text queries: each has right answers in the gallery, and a hit can be judged.

A query names a colour and a shape, and sometimes a size or a position; a gallery scene is a
right answer when it has every attribute the query names (the file names carry the truth:
``colour-shape-size-position``). Queries are drawn from the gallery's own scenes, so there is
always at least one right answer to find.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from themis_clip.demo.scenes import Scene

__all__ = ["DemoQuery", "demo_queries"]


@dataclass(frozen=True, kw_only=True)
class DemoQuery:
    colour: str
    shape: str
    size: str | None = None
    position: str | None = None

    @property
    def text(self) -> str:
        where = ""
        if self.position is not None:
            where = " in the center" if self.position == "center" else f" on the {self.position}"
        size = f"{self.size} " if self.size else ""
        return f"a {size}{self.colour} {self.shape}{where}"

    def matches(self, scene: Scene) -> bool:
        """Whether ``scene`` is a right answer: it has every attribute the query names."""
        return (
            scene.colour == self.colour
            and scene.shape == self.shape
            and self.size in (None, scene.size)
            and self.position in (None, scene.position)
        )


def demo_queries(scenes: Sequence[Scene], n: int = 4) -> list[DemoQuery]:
    """Up to ``n`` queries of growing detail, each taken from a different scene of the gallery
    (colour and shape; with the size; with the position), so each has a right answer."""
    kinds = ("plain", "size", "position", "plain")
    out: list[DemoQuery] = []
    used: set[tuple[str, str]] = set()
    for scene in scenes:
        if len(out) == n:
            break
        if (scene.colour, scene.shape) in used:
            continue
        used.add((scene.colour, scene.shape))
        kind = kinds[len(out) % len(kinds)]
        out.append(
            DemoQuery(
                colour=scene.colour,
                shape=scene.shape,
                size=scene.size if kind == "size" else None,
                position=scene.position if kind == "position" else None,
            )
        )
    return out
