"""The keys-file model: digests only, scopes, re-reading on change, failing closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from themis_clip.errors import ConfigError
from themis_clip.server.auth import (
    KeyStore,
    Scope,
    create_key,
    list_keys,
    parse_scopes,
    revoke_key,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_parse_scopes() -> None:
    assert parse_scopes(" Search,write ") == {Scope.SEARCH, Scope.WRITE}
    with pytest.raises(ConfigError, match="unknown scope 'read'"):
        parse_scopes("search,read")
    with pytest.raises(ConfigError, match="no scope"):
        parse_scopes(",")


def test_store_reads_changes_and_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    name, key = create_key(path, frozenset({Scope.SEARCH}))
    assert name == "key-1" and key not in path.read_text()
    clock = Clock()
    store = KeyStore(path, admin_token="tok", clock=clock)
    who = store.authenticate(key)
    assert who is not None and who.name == "key-1" and who.scopes == {Scope.SEARCH}
    assert store.authenticate(key + "x") is None
    assert store.authenticate("tok") is not None  # the admin token is an admin key
    assert store.authenticate("tok").scopes == {Scope.ADMIN}  # type: ignore[union-attr]

    _, second = create_key(path, frozenset({Scope.WRITE}), "ingest")
    assert store.authenticate(second) is None  # not looked at again within a second
    clock.now += 1.5
    assert store.authenticate(second) is not None  # re-read: no restart needed

    revoke_key(path, "key-1")
    clock.now += 1.5
    assert store.authenticate(key) is None

    path.write_text("{broken")
    clock.now += 1.5
    assert store.authenticate(second) is None  # an unusable file accepts no key

    with pytest.raises(ConfigError, match="does not exist"):
        KeyStore(tmp_path / "absent.json")


def test_last_use_goes_to_a_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    _, key = create_key(path, frozenset({Scope.METRICS}), "scraper")
    before = path.read_bytes()
    assert list_keys(path)[0].last_used is None
    assert KeyStore(path).authenticate(key) is not None
    assert path.read_bytes() == before  # the server never rewrites the keys file
    assert list_keys(path)[0].last_used is not None
    used = json.loads(path.with_name("keys.json.used").read_text())
    assert key not in json.dumps(used)


def test_malformed_entries_are_named(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"version": 1, "keys": [{"name": "a"}]}))
    with pytest.raises(ConfigError, match="entry 0 is malformed"):
        list_keys(path)
    path.write_text(json.dumps({"version": 9, "keys": []}))
    with pytest.raises(ConfigError, match="version-1"):
        list_keys(path)
