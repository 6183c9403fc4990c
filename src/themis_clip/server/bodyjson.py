"""Large JSON bodies parsed in a child process and handed back in slices (issue 30 item 6).

A 20 MB body stalled the event loop even when parsed in a worker thread: the GIL is one lock,
and what holds it in one C call holds up every other request. Measured in-process on a 20 MB
body (``bench/bench_healthz_during_upload.py --stages``): ``json.loads`` holds it 9-25 ms for
one base64 image (the string scanner), 35 ms for 620,000 short strings, and 0.5-0.8 s for
340,000 small objects, where the cyclic garbage collector's full passes over the growing
structure (30-100 ms each) cost more than the parse; freeing that value again took 150 ms
in one cascade of deallocations.

So a body from :data:`OFF_PROCESS_BYTES` on is parsed by the one strict parser
(:func:`themis_clip.jsonio.parse_body`) in a child process, which sends back the value cut into
parts of at most ``jsonio.RUN_VALUES`` values each (long strings in pieces of
``jsonio.PIECE_CHARS`` characters). Here the parts are joined on the event loop itself, each
step an unpickling of microseconds to a millisecond, and one :class:`_Slicer` per loop gives
all requests' steps together :data:`SLICE_S` per loop turn; the collector is paused while they
are joined and the result is frozen out of its reach (``gc.freeze``) until :func:`release`
frees it, also a slice at a time, when the request ends. The rules and the messages are those
of the in-process parse: the same function runs in the child. Where the child cannot help (a
value nested too deeply to pickle, or a child that died), the body is parsed in this process as
before.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import themis_clip
from themis_clip.jsonio import RUN_VALUES, join_steps, parse_body, read_answer, run_to_end

__all__ = [
    "ANSWER_TIMEOUT_S",
    "OFF_PROCESS_BYTES",
    "SLICE_S",
    "LargeBodies",
    "large_bodies",
    "run_in_slices",
    "run_to_end",
]

#: bodies from this size on are parsed in the child process
OFF_PROCESS_BYTES = 1 << 20
#: the event loop runs other callbacks at least this often while it joins or frees a value
SLICE_S = 0.002
#: a child that has not answered within this many seconds is killed and replaced (a 20 MB
#: body of the costliest shape takes it ~3 s on a loaded core; a stopped or wedged child
#: would otherwise hold every large body after it, since they are asked one at a time)
ANSWER_TIMEOUT_S = 15.0

_T = TypeVar("_T")

log = logging.getLogger(__name__)


def _drain_steps(built: list[Any]) -> Generator[None, None, None]:
    """Free the large lists and dicts :func:`~themis_clip.jsonio.join_steps` listed in
    ``built`` (each after its members), outermost first, a slice at a time: a slice frees
    small members only, the large ones are still held by ``built`` until their turn. One that
    something else still holds is left as it is (its holder frees it)."""
    while built:
        obj = built.pop()
        # References now: ``obj`` and getrefcount's argument, when nothing else holds it
        # (its container, if it had one, was emptied before it).
        if sys.getrefcount(obj) > 2:
            continue
        if isinstance(obj, list):
            while obj:
                del obj[-RUN_VALUES:]
                yield
        else:
            keys = list(obj)
            for i in range(0, len(keys), RUN_VALUES):
                for key in keys[i : i + RUN_VALUES]:
                    del obj[key]
                yield
        del obj


class _Slicer:
    """The one driver of an event loop's sliced work: it runs every job's steps in turn and
    hands the loop back once :data:`SLICE_S` has passed in all, however many jobs there are.
    (Each job slicing on its own let four concurrent 20 MB bodies take a slice each in the
    same loop iteration, and a probe waited for all four.)"""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: deque[tuple[Generator[None, None, Any], asyncio.Future[Any]]] = deque()
        self._driver: asyncio.Task[None] | None = None

    def submit(self, steps: Generator[None, None, _T]) -> asyncio.Future[_T]:
        done: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        self._jobs.append((steps, done))
        if self._driver is None:
            self._driver = asyncio.ensure_future(self._drive())
        return done

    async def _drive(self) -> None:
        try:
            while self._jobs:
                deadline = time.perf_counter() + SLICE_S
                while self._jobs and time.perf_counter() < deadline:
                    self._step()
                await asyncio.sleep(0)
        finally:
            self._driver = None
            if _slicers.get(self._loop) is self:
                del _slicers[self._loop]  # a slicer lives while it has work (no loop is kept)
            for steps, done in self._jobs:  # the loop is closing: nothing will drive these
                steps.close()
                done.cancel()
            self._jobs.clear()

    def _step(self) -> None:
        """One step of the first job, which then goes to the back of the queue (round robin):
        a finished, failed or abandoned job leaves it with its future settled."""
        steps, done = self._jobs.popleft()
        if done.cancelled():  # its request was cancelled (a disconnect, a deadline)
            steps.close()
            return
        try:
            next(steps)
        except StopIteration as finished:
            done.set_result(finished.value)
            return
        except BaseException as exc:  # the job's own error, raised where it is awaited
            done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt and the like end the driver too
            return
        self._jobs.append((steps, done))


#: each event loop's slicer, while it has work (its entry goes when its queue runs dry, so no
#: closed loop is kept)
_slicers: dict[asyncio.AbstractEventLoop, _Slicer] = {}


async def run_in_slices(steps: Generator[None, None, _T], *, finish: bool = False) -> _T:
    """Drive ``steps`` on the event loop in short pieces, letting other callbacks run every
    :data:`SLICE_S` counted over all the loop's sliced work together: GIL-bound work in short
    pieces, where a worker thread would take the GIL from the loop for a whole switch interval
    (5 ms) each time the loop wants it back. Cancelling the caller abandons the work, unless
    ``finish`` (work that must end, such as freeing a value a slice at a time)."""
    loop = asyncio.get_running_loop()
    slicer = _slicers.get(loop)
    if slicer is None:
        slicer = _slicers[loop] = _Slicer(loop)
    done = slicer.submit(steps)
    return await (asyncio.shield(done) if finish else done)


class _Child:
    """The parsing process: ``python -c`` running :func:`themis_clip.jsonio.serve_parts` on
    its stdin and stdout (not multiprocessing, which would import the caller's main module
    again in the child: a script that starts a server at import would start another)."""

    def __init__(self) -> None:
        package_root = str(Path(themis_clip.__file__).resolve().parents[1])
        code = (
            f"import sys; sys.path.insert(0, {package_root!r}); import themis_clip.jsonio as j; "
            "j.serve_parts(sys.stdin.buffer, sys.stdout.buffer)"
        )
        self.proc = subprocess.Popen(  # noqa: S603 (our interpreter and our code)
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def ask(self, body: bytes | bytearray) -> tuple[str | None, Any, bool]:
        """The child's answer for ``body``; a child silent for :data:`ANSWER_TIMEOUT_S` is
        killed, which ends the read with ``EOFError`` (or ``OSError`` on the write)."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        watchdog = threading.Timer(ANSWER_TIMEOUT_S, self._wedged)
        watchdog.daemon = True
        watchdog.start()
        try:
            self.proc.stdin.write(len(body).to_bytes(8, "big"))
            self.proc.stdin.write(body)
            self.proc.stdin.flush()
            return read_answer(self.proc.stdout)
        finally:
            watchdog.cancel()

    def _wedged(self) -> None:
        log.warning(
            "the JSON parsing process (pid %d) gave no answer in %.0f s: killing it",
            self.proc.pid,
            ANSWER_TIMEOUT_S,
        )
        with contextlib.suppress(OSError):
            self.proc.kill()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the child's loop ends at the end of its input
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LargeBodies:
    """The parsing process and the thread that talks to it (both started on first use). The
    values are joined and freed on the event loop itself, a slice at a time: in a thread, the
    joining code would take the GIL from the loop for a switch interval (5 ms) at a time."""

    def __init__(self) -> None:
        self._child: _Child | None = None
        self._talk: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._joining = 0  # joins under way (the collector is off while there are any)
        self._held = 0  # joined values not yet released (while any, they are frozen)
        self._collecting = True

    def start_soon(self) -> None:
        """Start the child in the background (its start-up, ~0.5 s, would otherwise fall in
        the first large request's deadline)."""
        if self._talk is None:
            self._talk = ThreadPoolExecutor(1, thread_name_prefix="themis-json")
            self._talk.submit(self._start)

    def _start(self) -> None:
        if self._child is None:
            self._child = _Child()

    def _ask(self, body: bytes | bytearray) -> tuple[str | None, Any, bool]:
        """In the talking thread (one body at a time): the child's answer; ``parsed`` false
        when no child could answer."""
        for _ in range(2):  # a child that died (killed, out of memory) is started again once
            if self._child is None:
                self._child = _Child()
            try:
                return self._child.ask(body)
            except (OSError, EOFError, ValueError):
                log.warning("the JSON parsing process ended; starting another")
                self._child.close()
                self._child = None
        return None, None, False

    async def parse(self, body: bytes | bytearray) -> tuple[str | None, Any, list[Any] | None]:
        """``(problem, value, built)``; when ``built`` is not None, pass it to :meth:`release`
        once the request is done, keeping no reference to the value. A value the child could
        not send back is parsed here (in a worker thread)."""
        self.start_soon()
        assert self._talk is not None
        loop = asyncio.get_running_loop()
        problem, parts, parsed = await loop.run_in_executor(self._talk, self._ask, body)
        if not parsed:
            problem, value = await asyncio.to_thread(parse_body, body)
            return problem, value, None
        if problem is not None:
            return problem, None, None
        built: list[Any] = []
        return None, await self._join(parts, built), built

    async def _join(self, parts: Any, built: list[Any]) -> Any:
        with self._lock:
            if self._joining == 0:
                self._collecting = gc.isenabled()
                if self._collecting:
                    # What is garbage now goes first (a young collection: ~1 ms): the freeze
                    # after the join would carry other requests' reference cycles out of the
                    # collector's reach, and with them whatever they hold (images, bodies).
                    gc.collect(1)
                # A full pass over a structure being built costs 30-100 ms in one piece.
                gc.disable()
            self._joining += 1
        try:
            value = await run_in_slices(join_steps(parts, built))
            with self._lock:
                gc.freeze()  # what is alive now (this value too) is out of the collector's reach
                self._held += 1
            return value
        finally:
            with self._lock:
                self._joining -= 1
                if self._joining == 0 and self._collecting:
                    gc.enable()

    async def release(self, built: list[Any]) -> None:
        """Free the value :meth:`parse` returned with ``built`` a slice at a time."""
        try:
            await run_in_slices(_drain_steps(built), finish=True)
        finally:
            with self._lock:
                self._held -= 1
                if self._held == 0:
                    gc.unfreeze()  # no joined value left: all back to the oldest generation

    def close(self) -> None:
        """Stop the thread and the child (a later :meth:`parse` starts them again)."""
        if self._talk is not None:
            self._talk.shutdown(wait=True)
            self._talk = None
        if self._child is not None:
            self._child.close()
            self._child = None


_shared: list[LargeBodies] = []


def large_bodies() -> LargeBodies:
    """The process's one :class:`LargeBodies` (one child process, however many apps)."""
    if not _shared:
        _shared.append(LargeBodies())
    return _shared[0]
