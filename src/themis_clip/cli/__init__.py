"""``themis-clip``: a thin command line over the library (parse, call, print).

One module per command group: ``embed`` (embed, info, health), ``index`` (index, search),
``migrate`` (move an index to another model), ``dataset`` (embed-dataset), ``serve``, ``keys``,
``export`` (export, verify), ``demo``, ``models`` (list, pull, info, rm, verify); ``common``
holds the model options and errors they share. A new command is a module with a
``register(sub)`` function, listed in :data:`_GROUPS`.

Exit codes: 0 success; 1 some inputs failed (results for the rest are still written);
2 usage, configuration or model errors.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from themis_clip._version import __version__
from themis_clip.allocator import pin_mmap_threshold
from themis_clip.cli import (
    classify,
    dataset,
    demo,
    duplicates,
    embed,
    export,
    index,
    keys,
    migrate,
    models,
    serve,
)
from themis_clip.cli.common import CLIError, not_initialize_failed, shown
from themis_clip.cli.extras import missing_extra
from themis_clip.errors import ThemisClipError

__all__ = ["main"]

_GROUPS = (
    embed,
    classify,
    index,
    migrate,
    duplicates,
    dataset,
    serve,
    keys,
    export,
    demo,
    models,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (``themis-clip`` calls ``sys.exit`` on it)."""
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # a bare `themis-clip` is a question, not a mistake
        parser.print_help()
        return 0
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = parser.commands[args.command]
        options = sorted({o for p in _walk(command) for o in p.option_strings()})
        hints = [_did_you_mean(e.split("=", 1)[0], options) for e in extras if e.startswith("-")]
        command.error(f"unrecognized arguments: {' '.join(extras)}" + "".join(hints))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("themis_clip.plugin").addFilter(not_initialize_failed)
    # Freed image buffers go back to the system (see themis_clip.allocator): a burst of large
    # images must not leave each decode thread's heap holding one image's worth of memory.
    pin_mmap_threshold()
    try:
        code: int = args.func(args)
        return code
    except (CLIError, ThemisClipError) as exc:
        print(f"themis-clip: error: {shown(str(exc))}", file=sys.stderr)
        return 2
    except ImportError as exc:
        message = missing_extra(exc, args.command)
        if message is None:
            raise
        print(f"themis-clip: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("themis-clip: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("themis-clip: stopped (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:  # `themis-clip ... | head`: the reader left; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the exit's flush must not fail again
        return 141  # 128 + SIGPIPE, as a shell reports it


class _Parser(argparse.ArgumentParser):
    """argparse that says "did you mean" for a mistyped command, subcommand or option."""

    def error(self, message: str) -> NoReturn:
        typo = re.search(r"invalid choice: '?([^' ]*)'? \(choose from", message)
        if typo is not None:
            message += _did_you_mean(typo.group(1), self.choices())
        super().error(message)

    def choices(self) -> list[str]:
        """The command names this parser dispatches on."""
        return [str(c) for a in self._actions if isinstance(a.choices, dict) for c in a.choices]

    def option_strings(self) -> list[str]:
        return [o for a in self._actions for o in a.option_strings if o.startswith("--")]

    @property
    def commands(self) -> dict[str, _Parser]:
        return {
            name: p
            for a in self._actions
            if isinstance(a.choices, dict)
            for name, p in a.choices.items()
        }


def _walk(parser: _Parser) -> Iterator[_Parser]:
    yield parser
    for child in parser.commands.values():
        yield from _walk(child)


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _parser() -> _Parser:
    parser = _Parser(prog="themis-clip", description="CLIP embeddings on ONNX Runtime")
    parser.add_argument("--version", action="version", version=f"themis-clip {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log lifecycle events")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in _GROUPS:
        group.register(sub)
    return parser


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that a command stops as after Ctrl-C: open
    transactions roll back, the model is shut down, and one line says why it stopped."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def entry() -> None:
    """The ``themis-clip`` command (``serve`` replaces the SIGTERM handler: it drains)."""
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
