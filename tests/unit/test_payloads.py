"""Image fields of JSON bodies: base64 and data URLs, strict, wrapped lines allowed."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import random

import pytest

from themis_clip.server import payloads
from themis_clip.server.errors import APIError


def test_base64_wrapped_or_in_a_data_url_is_decoded() -> None:
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
def test_what_base64_refuses_is_refused(value: str) -> None:
    with pytest.raises((binascii.Error, ValueError)):
        base64.b64decode(value.replace("\n", ""), validate=True)
    with pytest.raises(APIError, match="not valid base64"):
        payloads.decode_image_field(value)


def test_large_fields_are_decoded_too() -> None:
    data = os.urandom(300_000)
    values = [
        "data:image/png;base64," + base64.b64encode(data).decode(),
        base64.b64encode(b"x").decode(),
    ]
    assert asyncio.run(payloads.decode_image_fields(values)) == [data, b"x"]
