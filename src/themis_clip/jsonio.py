"""Strict JSON for every file this package reads (configs, manifests, peers' side files) and
for the server's request bodies.

``json`` accepts ``NaN``, ``Infinity`` and duplicate keys, which no JSON standard does; here they
are errors, so one rule holds for all readers. :func:`is_number` is the one test for a JSON
number (``true`` is not one). :func:`parse_body` is the rule for a request body (bytes that must
also be valid UTF-8), with the message the server answers; :func:`parse_body_parts` runs it in
another process and returns the value cut into parts that :func:`join_parts` puts together one
short step at a time (see :mod:`themis_clip.server.bodyjson` for why).
"""

from __future__ import annotations

import json
import math
import pickle
import sys
from collections.abc import Generator, Sequence
from itertools import chain
from pathlib import Path
from typing import IO, Any, TypeVar

_T = TypeVar("_T")

__all__ = [
    "PIECE_CHARS",
    "RUN_VALUES",
    "is_number",
    "join_parts",
    "join_steps",
    "loads",
    "parse_body",
    "parse_body_parts",
    "read",
    "read_answer",
    "run_to_end",
    "serve_parts",
]

#: at most this many JSON values cross in one part (one unpickling: about 1 ms for objects)
RUN_VALUES = 4096
#: strings longer than this cross in pieces of this many characters
PIECE_CHARS = 1 << 20


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def loads(text: str | bytes) -> Any:
    """``json.loads`` without NaN/Infinity and without duplicate keys.

    Raises:
        ValueError: not valid (strict) JSON.
    """
    return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)


def read(path: Path) -> Any:
    """The strict JSON document in the file ``path``.

    Raises:
        OSError: the file cannot be read.
        ValueError: not valid (strict) JSON; the message names the file.
    """
    data = path.read_bytes()
    try:
        return loads(data)
    except ValueError as exc:  # json.JSONDecodeError and ours; UnicodeDecodeError too
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def is_number(value: Any) -> bool:
    """A finite JSON number: an int or float, not a bool, not NaN or infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_body(body: bytes | bytearray) -> tuple[str | None, Any]:
    """``(None, value)`` for strict JSON (valid UTF-8, no NaN/Infinity, no duplicate keys,
    nesting within the parser's bound), else ``(why, None)``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"request body is not valid UTF-8 (byte {exc.start})", None
    try:
        return None, loads(text)
    except RecursionError:  # the C parser's own bound (about 1,000 levels)
        return "request body is nested deeper than the JSON parser allows", None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's own hint is not for clients
            limit = sys.get_int_max_str_digits()
            return f"request body holds an integer of more than {limit} digits", None
        return f"request body is not valid JSON: {exc}", None


# -- the parts: what crosses between the processes -----------------------------------------------
# Parts are ``(tree, blobs)``: ``blobs`` are pickles (each ``RUN_VALUES`` values at most), which
# the tree names by index:
# ("v", i)                a value small enough to cross whole
# ("s", [i, ...])         a long string, in pieces
# ("l", [sub, ...])       a large list: ("r", i) runs of items and ("i", tree) items
# ("d", [sub, ...])       a large dict: ("r", i) runs of members and ("k", key, tree) members


def _keep(blobs: list[bytes], value: Any) -> int:
    blobs.append(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    return len(blobs) - 1


def _load(blob: bytes | memoryview) -> Any:
    # Only pickles that _keep or serve_parts made in our own parsing process, of a parsed JSON
    # value (strings, numbers, lists, dicts): a client's bytes are never unpickled.
    return pickle.loads(blob)  # noqa: S301


#: the types of JSON's scalars as ``json`` parses them (a string is checked for its length)
_SCALARS = frozenset({int, float, bool, type(None)})
#: a container of at most this many members, all scalars or short strings, is counted in one
#: loop without the bookkeeping of a split (a body of millions of ``{"a": 0}`` took 4.7 s)
_FLAT = 64


def _flat_size(members: Any) -> int:
    """``len + 1`` for members that are scalars or short strings only, else 0."""
    for member in members:
        kind = type(member)
        if kind not in _SCALARS and not (kind is str and len(member) <= PIECE_CHARS):
            return 0
    return len(members) + 1


def _flat_list_run(value: list[Any]) -> int | None:
    """Members per run for a list of scalars and short strings only, or of small dicts of
    those only (checked with C-level iterators: a Python loop over millions of members took
    seconds), else None."""
    kinds = set(map(type, value))
    if kinds <= _SCALARS | {str}:
        strings = value if kinds == {str} else [m for m in value if type(m) is str]
        if strings and max(map(len, strings)) > PIECE_CHARS:
            return None
        return RUN_VALUES
    if kinds != {dict} or max(map(len, value)) > min(_FLAT, RUN_VALUES):
        return None
    inner = set(map(type, chain.from_iterable(map(dict.values, value))))
    if not inner <= _SCALARS | {str}:
        return None
    if (
        str in inner
        and max(
            (len(m) for m in chain.from_iterable(map(dict.values, value)) if type(m) is str),
            default=0,
        )
        > PIECE_CHARS
    ):
        return None
    return max(1, RUN_VALUES // (max(map(len, value)) + 1))


def _split(value: Any, blobs: list[bytes]) -> tuple[Any, int]:
    """``(tree, 0)`` for a value that must cross in parts, else ``(None, its value count)``."""
    kind = type(value)
    if kind in _SCALARS:
        return None, 1
    small = min(_FLAT, RUN_VALUES)
    if kind is dict and len(value) <= small and (size := _flat_size(value.values())):
        return None, size
    if kind is list and len(value) <= small and (size := _flat_size(value)):
        return None, size
    if isinstance(value, str):
        if len(value) <= PIECE_CHARS:
            return None, 1
        step = PIECE_CHARS
        return ("s", [_keep(blobs, value[i : i + step]) for i in range(0, len(value), step)]), 0
    if isinstance(value, list):
        if (per_run := _flat_list_run(value)) is not None:
            if len(value) <= per_run:
                return None, len(value) + 1
            runs = range(0, len(value), per_run)
            return ("l", [("r", _keep(blobs, value[i : i + per_run])) for i in runs]), 0
        return _split_members(list(enumerate(value)), [], blobs)
    if isinstance(value, dict):
        return _split_members(list(value.items()), {}, blobs)
    return None, 1


def _split_members(
    members: list[tuple[Any, Any]], empty: Any, blobs: list[bytes]
) -> tuple[Any, int]:
    is_dict = isinstance(empty, dict)
    subs: list[tuple[Any, ...]] = []
    run, run_size, total = empty.copy(), 0, 1

    def flush() -> None:
        nonlocal run, run_size
        if run:
            subs.append(("r", _keep(blobs, run)))
        run, run_size = empty.copy(), 0

    for key, member in members:
        tree, size = _split(member, blobs)
        if tree is not None:
            flush()
            subs.append(("k", key, tree) if is_dict else ("i", tree))
            continue
        if is_dict:
            run[key] = member
        else:
            run.append(member)
        run_size += size
        total += size
        if run_size >= RUN_VALUES:
            flush()
    if not subs:
        return None, total  # small: the caller sends it with its neighbours
    flush()
    return ("d" if is_dict else "l", subs), 0


def parse_body_parts(body: bytes) -> tuple[str | None, Any, bool]:
    """:func:`parse_body` for another process: ``(problem, parts, parsed)``, where ``parts``
    is the value for :func:`join_parts`; ``parsed`` is false when the value cannot be cut into
    parts (nested too deeply to pickle): the caller parses the body itself."""
    problem, value = parse_body(body)
    if problem is not None:
        return problem, None, True
    blobs: list[bytes] = []
    try:
        tree, _ = _split(value, blobs)
        return None, (("v", _keep(blobs, value)) if tree is None else tree, blobs), True
    except RecursionError:
        return None, None, False


def join_steps(
    parts: tuple[Any, Sequence[bytes | memoryview]], built: list[Any] | None = None
) -> Generator[None, None, Any]:
    """The value :func:`parse_body_parts` cut into ``parts``, put together a run at a time:
    a generator that yields after each unpickling (a short C call: at most ``RUN_VALUES``
    values or ``PIECE_CHARS`` characters) and returns the value. ``built`` receives the large
    lists and dicts, each after its members (the value itself last, if it is one)."""
    tree, blobs = parts
    return (yield from _join_tree(tree, blobs, [] if built is None else built))


def _join_tree(
    tree: Any, blobs: Sequence[bytes | memoryview], built: list[Any]
) -> Generator[None, None, Any]:
    kind, payload = tree
    if kind == "v":
        return _load(blobs[payload])
    if kind == "s":
        # Grown a piece at a time: CPython appends in place to a string nothing else holds
        # (a realloc, which for a block past the mmap threshold remaps its pages instead of
        # copying them), so each step copies its own piece. A join at the end copied a 20 MB
        # data URL into fresh pages in one call that holds the GIL (~10 ms here).
        text = ""
        for i in payload:
            text += _load(blobs[i])
            yield
        return text
    if kind == "l":
        items: list[Any] = []
        for sub in payload:
            if sub[0] == "r":
                items.extend(_load(blobs[sub[1]]))
                yield
            else:
                items.append((yield from _join_tree(sub[1], blobs, built)))
        built.append(items)
        return items
    members: dict[str, Any] = {}
    for sub in payload:
        if sub[0] == "r":
            members.update(_load(blobs[sub[1]]))
            yield
        else:
            members[sub[1]] = yield from _join_tree(sub[2], blobs, built)
    built.append(members)
    return members


def run_to_end(steps: Generator[None, None, _T]) -> _T:
    """Drive ``steps`` (a generator of work, yielding between short pieces) in one go."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: _T = done.value
            return result


def join_parts(parts: tuple[Any, Sequence[bytes | memoryview]]) -> Any:
    """:func:`join_steps` in one go."""
    return run_to_end(join_steps(parts))


def serve_parts(source: IO[bytes], sink: IO[bytes]) -> None:
    """A parsing process's loop. A request on ``source``: an 8-byte big-endian length, the
    body. Its answer on ``sink``: the length of a pickled header ``(problem, tree, parsed,
    blob lengths)``, the header, then the blobs back to back (written as they are, so that
    :func:`read_answer` reads them into one buffer and copies none). Returns at the end of
    ``source``."""
    while len(head := source.read(8)) == 8:
        problem, parts, parsed = parse_body_parts(source.read(int.from_bytes(head, "big")))
        tree, blobs = parts if parts is not None else (None, [])
        header = pickle.dumps((problem, tree, parsed, [len(b) for b in blobs]))
        sink.write(len(header).to_bytes(8, "big"))
        sink.write(header)
        for blob in blobs:
            sink.write(blob)
        sink.flush()


def _read(source: IO[bytes], n: int) -> bytes:
    data = source.read(n)
    if len(data) < n:
        raise EOFError("the parsing process ended")
    return data


def read_answer(source: IO[bytes]) -> tuple[str | None, Any, bool]:
    """One answer :func:`serve_parts` wrote on ``source``: ``(problem, parts, parsed)`` as
    :func:`parse_body_parts` returned them, the blobs as views of one buffer (``EOFError``
    when the answer is cut short)."""
    header = _read(source, int.from_bytes(_read(source, 8), "big"))
    problem, tree, parsed, lengths = _load(header)
    data = memoryview(_read(source, sum(lengths)))
    views, at = [], 0
    for n in lengths:
        views.append(data[at : at + n])
        at += n
    return problem, (tree, views) if tree is not None else None, parsed
