"""The dialects' pure parts: immich's entries and languages, Cohere's embedding types, and the
keyless network rule (the doors themselves run against the real server in
tests/integration/test_immich.py and test_dialects.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from themis_clip.server.access import _peer_in, parse_networks
from themis_clip.server.errors import APIError
from themis_clip.server.routes.dialects import clip_entry, flores_code, quantized


def test_clip_entry_reads_what_immichs_server_sends() -> None:
    visual = json.dumps({"clip": {"visual": {"modelName": "ViT-B-32__openai"}}})
    assert clip_entry(visual) == ("ViT-B-32__openai", "visual", {})
    textual = {"clip": {"textual": {"modelName": "m", "options": {"language": "de"}}}}
    assert clip_entry(json.dumps(textual)) == ("m", "textual", {"language": "de"})


@pytest.mark.parametrize(
    ("entries", "status"),
    [
        ('{"facial-recognition": {"detection": {"modelName": "buffalo_l"}}}', 501),
        ('{"ocr": {}}', 501),
        ("{", 422),
        ('{"clip": {"visual": {"modelName": 3}}}', 422),
        ('{"clip": {"audio": {"modelName": "m"}}}', 422),
        ('{"clip": {"visual": {"modelName": "m"}, "textual": {"modelName": "m"}}}', 422),
        ('{"clip": {"textual": {"modelName": "m", "options": []}}}', 422),
    ],
)
def test_clip_entry_refuses_with_a_named_error(entries: str, status: int) -> None:
    with pytest.raises(APIError) as err:
        clip_entry(entries)
    assert err.value.status == status


def test_flores_code_follows_immichs_fallbacks() -> None:
    assert flores_code("de") == "deu_Latn"
    assert flores_code("zh-TW") == "zho_Hant"
    assert flores_code("de-AT") == "deu_Latn"  # the part before '-'
    assert flores_code("tlh") == "eng_Latn"  # unknown: English, as immich defaults


def test_cohere_types_of_unit_vectors() -> None:
    v = np.array([[0.6, -0.8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1]], dtype=np.float32)
    v /= np.linalg.norm(v)
    assert quantized(v, "int8")[0][:2] == [95, -127]  # scaled to 127 at the largest
    assert quantized(v, "uint8")[0][:2] == [223, 1]
    assert quantized(v, "ubinary") == [[0b10000000, 0b10000000]]  # 9 signs in 2 bytes
    assert quantized(v, "binary") == [[0, 0]]  # the same bytes minus 128
    assert np.array_equal(quantized(v, "float"), v.tolist())


def test_keyless_networks_match_the_peer_address() -> None:
    nets = parse_networks(["172.16.0.0/12", "10.0.0.5", "fd00::/8"])
    assert _peer_in({"client": ("172.18.0.3", 5000)}, nets) is not None
    assert _peer_in({"client": ("::ffff:10.0.0.5", 5000)}, nets) is not None  # dual stack
    assert _peer_in({"client": ("fd12::1", 5000)}, nets) is not None
    assert _peer_in({"client": ("192.168.1.2", 5000)}, nets) is None
    assert _peer_in({"client": None}, nets) is None
    assert _peer_in({"client": ("172.18.0.3", 5000)}, ()) is None
    with pytest.raises(ValueError, match="'immich' is not a network"):
        parse_networks(["immich"])
    # an IPv4-mapped block is its IPv4 block, as peers are compared
    mapped = parse_networks(["::ffff:127.0.0.1", "::ffff:10.0.0.0/104"])
    assert _peer_in({"client": ("127.0.0.1", 5000)}, mapped) is not None
    assert _peer_in({"client": ("::ffff:10.1.2.3", 5000)}, mapped) is not None
    with pytest.raises(ValueError, match="host bits set; did you mean 10.0.0.0/8"):
        parse_networks(["10.0.0.1/8"])
    for everyone in ("0.0.0.0/0", "::/0"):
        with pytest.raises(ValueError, match="admits every address"):
            parse_networks([everyone])
