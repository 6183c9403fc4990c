"""Large JSON bodies: parsed in a child process under the strict rules, handed back in parts,
joined and freed a slice at a time (issue 30 item 6; the latency is bench_healthz_during_upload's
figure, not asserted here)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import gc
import io
import json
import os
import pickle
import random
import signal
from typing import Any

import pytest

from themis_clip import jsonio
from themis_clip.server import bodyjson, payloads
from themis_clip.server.bodyjson import OFF_PROCESS_BYTES, LargeBodies
from themis_clip.server.errors import APIError

PAD = "x" * OFF_PROCESS_BYTES  # makes any body large enough for the child process


def nested_value() -> dict[str, Any]:
    return {
        "items": [{"id": f"i{i}", "n": i, "tags": ["a", "b"], "m": {"k": i}} for i in range(50)],
        "texts": [f"t{i} \u00e9\u4e2d\U0001f600" for i in range(40)],
        "long": "0123456789abcdef" * 9 + "\ud800 lone",  # pieces; a lone surrogate crosses too
        "big": 2**70,
        "neg": -(2**65),
        "float": 0.1,
        "wide": {f"k{i}": i for i in range(30)},
        "deep": [[[list(range(20))]]],
        "empty": [{}, [], ""],
    }


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny runs and pieces, so that small values take every path of the splitting."""
    monkeypatch.setattr(jsonio, "RUN_VALUES", 8)
    monkeypatch.setattr(jsonio, "PIECE_CHARS", 16)
    monkeypatch.setattr(bodyjson, "RUN_VALUES", 8)


def test_parts_put_back_the_same_value_in_the_same_order(small_parts: None) -> None:
    value = nested_value()
    body = json.dumps(value).encode()
    problem, parts, parsed = jsonio.parse_body_parts(body)
    assert problem is None and parsed
    tree, blobs = parts
    assert tree[0] == "d" and len(blobs) > 20  # really cut: runs, pieces, nested large lists
    built: list[Any] = []
    joined = run(jsonio.join_steps(parts, built))
    assert joined == value
    assert json.dumps(joined) == json.dumps(value)  # key order kept
    assert joined["big"] == 2**70 and isinstance(joined["big"], int)
    assert joined is built[-1]  # the value last, after its large members
    assert any(c is joined["items"] for c in built)


@pytest.mark.parametrize(
    "value",
    [
        list(range(50)),  # scalars: runs cut without a loop in Python
        [True, None, 1.5, "s", -3] * 9,
        [f"t{i}" for i in range(30)],
        [f"t{i}" for i in range(30)] + ["a string longer than a piece"],  # the long one split
        [{"a": i, "b": f"s{i}", "c": None} for i in range(40)],  # small flat dicts: runs
        [{"a": i} for i in range(20)] + [{"a": "a string longer than a piece"}],
        [{"a": i} for i in range(20)] + [{"a": [1, 2]}],  # not flat: member by member
        [{f"k{j}": j for j in range(9)} for _ in range(5)],  # dicts wider than a run
        [{}, {}, {}] * 5,
    ],
)
def test_flat_lists_cross_in_runs_and_come_back_equal(small_parts: None, value: Any) -> None:
    body = json.dumps({"x": value}).encode()
    problem, parts, parsed = jsonio.parse_body_parts(body)
    assert problem is None and parsed
    tree, blobs = parts
    assert tree[0] == "d" and len(blobs) >= 2  # cut into parts
    joined = run(jsonio.join_steps(parts))
    assert joined == {"x": value}
    assert json.dumps(joined) == json.dumps({"x": value})
    for blob in blobs:  # no part holds more than a run's values or a piece's characters
        part = pickle.loads(blob)
        if isinstance(part, str):
            assert len(part) <= 16
        elif isinstance(part, list):
            assert sum(len(m) + 1 if isinstance(m, dict) else 1 for m in part) <= 8 + 10, part


def test_framing_between_the_processes(small_parts: None) -> None:
    value = nested_value()
    requests = io.BytesIO()
    for body in (json.dumps(value).encode(), b'{"a": NaN}'):
        requests.write(len(body).to_bytes(8, "big") + body)
    requests.seek(0)
    answers = io.BytesIO()
    jsonio.serve_parts(requests, answers)
    answers.seek(0)
    problem, parts, parsed = jsonio.read_answer(answers)
    assert problem is None and parsed and jsonio.join_parts(parts) == value
    assert jsonio.read_answer(answers) == (
        "request body is not valid JSON: NaN is not valid JSON",
        None,
        True,
    )
    with pytest.raises(EOFError):
        jsonio.read_answer(answers)


def run(steps: Any) -> Any:
    return bodyjson.run_to_end(steps)


@pytest.fixture
def bodies() -> Any:
    large = LargeBodies()
    yield large
    large.close()


def parse(large: LargeBodies, body: bytes) -> tuple[str | None, Any, bool]:
    """``(problem, value, held)``: the value is released at once, and kept as it is, since
    the caller holds it."""

    async def go() -> tuple[str | None, Any, bool]:
        problem, value, built = await large.parse(body)
        if built is not None:
            await large.release(built)
        return problem, value, built is not None

    return asyncio.run(go())


@pytest.mark.parametrize(
    "body",
    [
        b'{"pad": "%s", "n": NaN}',
        b'{"pad": "%s", "n": Infinity}',
        b'{"pad": "%s", "n": -Infinity}',
        b'{"pad": "%s", "pad": "again"}',
        b'{"pad": "%s", "items": [{"id": 1, "id": 2}]}',
        b'{"pad": "%s\xff"}',
        b'{"pad": "%s\xed\xa0\x80"}',  # a surrogate encoded in UTF-8 is not valid UTF-8
        b'{"pad": "%s"',
        b'{"pad": "%s", "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"pad": "%s"} trailing',
    ],
    ids=[
        "nan",
        "inf",
        "-inf",
        "dup",
        "nested-dup",
        "utf8",
        "surrogate-utf8",
        "cut",
        "deep",
        "tail",
    ],
)
def test_the_child_keeps_the_strict_rules_and_their_messages(
    bodies: LargeBodies, body: bytes
) -> None:
    body = body.replace(b"%s", PAD.encode())
    assert len(body) >= OFF_PROCESS_BYTES
    problem, value, held = parse(bodies, body)
    expected, _ = jsonio.parse_body(body)  # the in-process parse (small bodies, files)
    assert expected is not None and problem == expected
    assert value is None and not held


def test_the_child_accepts_what_json_accepts(bodies: LargeBodies) -> None:
    body = (
        f'{{"pad": "{PAD}", "lone": "\\ud800", "big": {2**80}, "e": 1.5e300, "u": "\\u00e9"}}'
    ).encode()
    problem, value, held = parse(bodies, body)
    assert problem is None and held
    assert value["lone"] == "\ud800"  # a lone surrogate escape is JSON; the routes refuse it (422)
    assert value["big"] == 2**80 and value["e"] == 1.5e300 and value["u"] == "\u00e9"
    assert value == json.loads(body)


def test_huge_integers_are_named_without_pythons_hint(bodies: LargeBodies) -> None:
    for body in (b'{"n": ' + b"7" * 5000 + b"}", f'{{"pad": "{PAD}", "n": {"7" * 5000}}}'.encode()):
        problem, _, _ = parse(bodies, body) if len(body) > 10_000 else (*jsonio.parse_body(body), 0)
        assert problem is not None and "integer of more than" in problem
        assert "sys." not in problem


def test_a_dead_child_is_replaced(bodies: LargeBodies) -> None:
    body = json.dumps({"pad": PAD, "n": 1}).encode()
    assert parse(bodies, body)[0] is None
    child = bodies._child
    assert child is not None
    child.proc.kill()
    child.proc.wait()
    problem, value, _ = parse(bodies, body)
    assert problem is None and value["n"] == 1
    assert bodies._child is not None and bodies._child is not child


def test_a_stopped_child_is_killed_and_replaced(
    bodies: LargeBodies, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = json.dumps({"pad": PAD, "n": 2}).encode()
    assert parse(bodies, body)[0] is None
    child = bodies._child
    assert child is not None
    monkeypatch.setattr(bodyjson, "ANSWER_TIMEOUT_S", 0.5)
    os.kill(child.proc.pid, signal.SIGSTOP)  # wedged: alive, never answering
    try:
        problem, value, _ = parse(bodies, body)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.proc.pid, signal.SIGCONT)
    assert problem is None and value["n"] == 2  # answered (by a new child or in-process)
    assert child.proc.wait(timeout=10) == -signal.SIGKILL
    monkeypatch.setattr(bodyjson, "ANSWER_TIMEOUT_S", 15.0)  # a new child's start-up fits
    problem, value, held = parse(bodies, body)
    assert problem is None and value["n"] == 2 and held
    assert bodies._child is not None and bodies._child is not child


def test_the_collector_skips_a_held_value_until_it_is_released(bodies: LargeBodies) -> None:
    body = json.dumps({"pad": PAD, "items": [{"i": i} for i in range(10_000)]}).encode()
    assert gc.get_freeze_count() == 0

    async def go() -> None:
        problem, value, built = await bodies.parse(body)
        assert problem is None and built is not None
        assert gc.isenabled() and gc.get_freeze_count() > 0  # out of the collector's reach
        items = value["items"]
        del value
        await bodies.release(built)
        assert gc.get_freeze_count() == 0
        assert len(items) == 10_000  # still held here: left as it was, not emptied

    asyncio.run(go())


class Counted:
    freed = 0

    def __del__(self) -> None:
        Counted.freed += 1


def test_release_frees_a_slice_at_a_time() -> None:
    Counted.freed = 0
    inner = [Counted() for _ in range(3 * bodyjson.RUN_VALUES)]
    outer = {"items": inner, "other": [Counted()]}
    built = [inner, outer]
    del inner, outer
    steps = bodyjson._drain_steps(built)
    next(steps)  # the outer dict's first slice: its small member goes; the large one waits
    assert Counted.freed == 1
    next(steps)
    assert Counted.freed == 1 + bodyjson.RUN_VALUES  # one slice of the large list
    assert list(steps) == [None, None]  # the large list's last two slices
    assert Counted.freed == 1 + 3 * bodyjson.RUN_VALUES


# -- base64 a piece at a time --------------------------------------------------------------------


def test_base64_in_pieces_is_base64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payloads, "_B64_PIECE", 8)
    rng = random.Random(7)
    for n in [*range(0, 40), 100, 1000]:
        data = os.urandom(n)
        text = base64.b64encode(data).decode()
        width = rng.randint(1, 11)
        wrapped = "\n".join(text[i : i + width] for i in range(0, len(text), width))
        for value in (text, wrapped, " " + wrapped + "\r\n", "data:image/png;base64," + wrapped):
            if n == 0:
                with pytest.raises(APIError, match="empty image"):
                    payloads.decode_image_field(value)
            else:
                assert payloads.decode_image_field(value) == data


@pytest.mark.parametrize(
    "value",
    [
        "QUJD=QUJD",
        "QUJDRA==QUJD",
        "QUJDRA=",
        "QUJDR",
        "QUJD@EFH",
        "QUJDRA==\nQQ==",
        "QUJD\u00e9EFG",
    ],
)
def test_base64_in_pieces_refuses_what_base64_refuses(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    with pytest.raises((binascii.Error, ValueError)):
        base64.b64decode(value.replace("\n", ""), validate=True)
    for piece in (4, 8, 1 << 18):
        monkeypatch.setattr(payloads, "_B64_PIECE", piece)
        with pytest.raises(APIError, match="not valid base64"):
            payloads.decode_image_field(value)


def test_large_fields_are_decoded_on_the_loop_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payloads, "_B64_PIECE", 1 << 12)
    data = os.urandom(300_000)
    values = [
        "data:image/png;base64," + base64.b64encode(data).decode(),
        base64.b64encode(b"x").decode(),
    ]
    assert asyncio.run(payloads.decode_image_fields(values)) == [data, b"x"]


def test_base64_in_pieces_is_written_into_one_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoded pieces go into the result's own buffer: a list of pieces joined at the end
    held the whole image twice, and copied it in one call that holds the GIL."""
    import tracemalloc

    monkeypatch.setattr(payloads, "_B64_PIECE", 1 << 16)
    data = os.urandom(4_000_000)
    text = "data:image/jpeg;base64," + base64.b64encode(data).decode()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        decoded = payloads.decode_image_field(text)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert decoded == data
    assert peak < 1.2 * len(data), peak  # the result and a piece or two, not the image twice
    # whitespace and padding leave the estimate long: the result is cut to the real length
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    assert payloads.decode_image_field(wrapped + "\r\n") == data
    assert payloads.decode_image_field(base64.b64encode(b"abcde").decode()) == b"abcde"


def test_sliced_work_shares_one_slice_per_loop_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """However many requests join or free values at once, the loop gets back after SLICE_S of
    their work in all (each job slicing on its own let four bodies take four slices in one
    turn, and a /healthz probe waited for all of them)."""

    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

    clock = Clock()
    monkeypatch.setattr(bodyjson, "time", clock)
    log: list[str] = []

    def job(name: str) -> Any:
        for _ in range(12):
            clock.now += bodyjson.SLICE_S / 4  # each step costs a quarter of a slice
            log.append(name)
            yield
        return name

    async def main() -> list[str]:
        done = False

        async def probe() -> None:
            while not done:
                log.append("probe")
                await asyncio.sleep(0)

        prober = asyncio.ensure_future(probe())
        await asyncio.sleep(0)
        results = await asyncio.gather(*(bodyjson.run_in_slices(job(f"j{i}")) for i in range(4)))
        done = True
        await prober
        return results

    assert asyncio.run(main()) == ["j0", "j1", "j2", "j3"]
    runs, current = [], 0
    for entry in log:
        if entry == "probe":
            runs.append(current)
            current = 0
        else:
            current += 1
    assert sum(runs) + current == 4 * 12
    assert max(runs) <= 4, runs  # one slice (4 steps) of work between two turns of the probe
    assert set(log[log.index("j0") : log.index("j0") + 8]) > {"j0", "j1"}  # in turn, round robin


def test_an_abandoned_sliced_job_stops_and_a_failing_one_raises_where_awaited() -> None:
    steps_run: list[int] = []

    def endless() -> Any:
        while True:
            steps_run.append(1)
            yield

    def failing() -> Any:
        yield
        raise ValueError("bad piece")

    async def main() -> None:
        task = asyncio.ensure_future(bodyjson.run_in_slices(endless()))
        while not steps_run:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen = len(steps_run)
        with pytest.raises(ValueError, match="bad piece"):
            await bodyjson.run_in_slices(failing())
        assert len(steps_run) <= seen + 1  # the cancelled job was dropped, not driven on
        freed: list[int] = []

        def freeing() -> Any:
            for i in range(3):
                freed.append(i)
                yield

        kept = asyncio.ensure_future(bodyjson.run_in_slices(freeing(), finish=True))
        while not freed:
            await asyncio.sleep(0)
        kept.cancel()
        with pytest.raises(asyncio.CancelledError):
            await kept  # the caller stops waiting; the work itself still runs to its end
        for _ in range(100):
            if len(freed) == 3:
                break
            await asyncio.sleep(0)
        assert freed == [0, 1, 2]

    asyncio.run(main())


def test_a_long_string_is_grown_a_piece_at_a_time() -> None:
    """Each piece is appended and dropped: the pieces are never all held beside the result
    (a join at the end held the string twice and copied it in one call holding the GIL)."""
    import tracemalloc

    text = base64.b64encode(os.urandom(6_000_000)).decode()
    problem, parts, parsed = jsonio.parse_body_parts(json.dumps({"image": text}).encode())
    assert problem is None and parsed
    assert parts is not None and parts[0][0] == "d"  # cut into pieces, not sent whole
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        value = jsonio.join_parts(parts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert value == {"image": text}
    assert peak < len(text) + 3 * jsonio.PIECE_CHARS, (peak, len(text))


def test_a_slicer_lives_only_while_it_has_work() -> None:
    def two() -> Any:
        yield
        return 2

    async def main() -> int:
        result = await bodyjson.run_in_slices(two())
        for _ in range(10):  # the driver's last turn ends after the job's result is set
            if not bodyjson._slicers:
                break
            await asyncio.sleep(0)
        assert not bodyjson._slicers
        return result

    assert asyncio.run(main()) == 2
    assert asyncio.run(main()) == 2  # a second loop gets its own


def test_the_loop_lag_watch_sees_a_stall() -> None:
    """``themis_event_loop_lag_seconds``: a callback that holds the loop for 60 ms shows as a
    lag of at least 60 ms less one period."""
    import time

    from themis_clip.server.metrics import LAG_PERIOD_S, watch_loop_lag

    seen: list[float] = []

    async def main() -> None:
        watch = asyncio.ensure_future(watch_loop_lag(seen.append))
        while len(seen) < 3:  # the watch runs, on time
            await asyncio.sleep(0)
        asyncio.get_running_loop().call_soon(time.sleep, 0.06)  # a stall of the whole loop
        count = len(seen)
        while len(seen) < count + 3:
            await asyncio.sleep(0)
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch

    asyncio.run(main())
    assert max(seen) >= 0.06 - LAG_PERIOD_S, seen
    assert min(seen) >= 0.0


def test_the_loop_lag_watch_slows_down_when_idle() -> None:
    import time

    from themis_clip.server.metrics import IDLE_LAG_PERIOD_S, LAG_PERIOD_S, Metrics, lag_period

    metrics = Metrics()
    period = lag_period(metrics)
    assert period() == IDLE_LAG_PERIOD_S  # no request yet
    metrics.observe("/healthz", 200, 0.001)
    assert period() == LAG_PERIOD_S
    metrics.last_request = time.monotonic() - 60
    assert period() == IDLE_LAG_PERIOD_S


def test_a_large_body_does_not_freeze_other_requests_garbage(bodies: LargeBodies) -> None:
    """A reference cycle that is garbage when a large body's join begins is collected, not
    frozen with the joined value (frozen, then unfrozen into the oldest generation, it waited
    for a full collection, holding what it held: 14 MB of image per failed upload)."""
    import weakref

    class Held:
        pass

    body = json.dumps({"pad": PAD, "n": 1}).encode()
    parse(bodies, body)  # the child is up; its start is not the point
    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1_000_000)  # no automatic collection before the join's own
    try:
        cycle = [Held()]
        cycle.append(cycle)
        alive = weakref.ref(cycle[0])
        del cycle  # garbage now, reachable by the collector only
        assert alive() is not None
        problem, _, held = parse(bodies, body)
        assert problem is None and held
        assert alive() is None
    finally:
        gc.set_threshold(*thresholds)
