"""Session tuning: the ``session`` config section and the optimised-model cache."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from themis_clip import BackendType, ConfigError, OnnxClipPlugin, PluginConfig, SessionConfig
from themis_clip.runtime import SessionSettings, create_session, plan_providers

CPU = "CPUExecutionProvider"


def load(model: Path, **session: object) -> OnnxClipPlugin:
    p = OnnxClipPlugin()
    assert p.initialize(
        PluginConfig.from_dict({"model": {"path": str(model)}, "session": dict(session)})
    ), p.get_statistics()
    return p


def embed(p: OnnxClipPlugin) -> tuple[list[float], list[float]]:
    img = np.random.default_rng(3).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    return (
        np.asarray(p.generate_embedding(img).embedding).tolist(),
        np.asarray(p.generate_text_embedding("a red circle on the left").embedding).tolist(),
    )


def test_session_section_parses_and_validates() -> None:
    cfg = PluginConfig.from_dict(
        {
            "model": {"path": "m"},
            "session": {
                "optimization_level": "extended",
                "optimized_model_cache_dir": "cache",
                "cpu_mem_arena": False,
                "allow_spinning": False,
            },
        },
        base_dir="/srv",
    )
    assert cfg.session == SessionConfig(
        optimization_level="extended",
        optimized_model_cache_dir="/srv/cache",
        cpu_mem_arena=False,
        allow_spinning=False,
    )
    assert PluginConfig.from_dict({"model": {"path": "m"}}).session == SessionConfig()
    with pytest.raises(ConfigError, match="session.optimization_level"):
        PluginConfig.from_dict({"model": {"path": "m"}, "session": {"optimization_level": "max"}})
    with pytest.raises(ConfigError, match="session.spin"):
        PluginConfig.from_dict({"model": {"path": "m"}, "session": {"spin": True}})
    with pytest.raises(ConfigError, match="session.cpu_mem_arena"):
        PluginConfig.from_dict({"model": {"path": "m"}, "session": {"cpu_mem_arena": "no"}})
    with pytest.raises(ConfigError, match="optimization_level"):
        SessionConfig(optimization_level="O3")


def test_settings_reach_onnx_runtime(tiny_model_dir: Path) -> None:
    (plan,) = plan_providers(BackendType.CPU, [CPU])
    settings = SessionSettings(
        cpu_mem_arena=False, allow_spinning=False, optimization_level="basic"
    )
    s = create_session(tiny_model_dir / "visual.onnx", plan, settings)
    opts = s.session.get_session_options()
    assert opts.enable_cpu_mem_arena is False
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert "BASIC" in str(opts.graph_optimization_level)
    s = create_session(tiny_model_dir / "visual.onnx", plan, SessionSettings())
    opts = s.session.get_session_options()
    assert opts.enable_cpu_mem_arena is True
    assert "ENABLE_ALL" in str(opts.graph_optimization_level)


@pytest.mark.parametrize("level", ["disabled", "basic", "extended", "all"])
def test_every_level_gives_the_same_embeddings(tiny_model_dir: Path, level: str) -> None:
    ref = load(tiny_model_dir)
    other = load(tiny_model_dir, optimization_level=level, allow_spinning=False)
    for a, b in zip(embed(ref), embed(other), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_optimized_model_cache_is_written_then_hit_with_identical_results(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "ort-cache"
    plain = embed(load(tiny_model_dir))
    cold = load(tiny_model_dir, optimized_model_cache_dir=str(cache))
    assert cold.get_statistics()["optimized_model_cache"] == {
        "visual": "written",
        "textual": "written",
    }
    entries = sorted(p for p in cache.iterdir())
    assert len(entries) == 2 and all((e / "model.onnx").is_file() for e in entries)
    warm = load(tiny_model_dir, optimized_model_cache_dir=str(cache))
    assert warm.get_statistics()["optimized_model_cache"] == {
        "visual": "hit",
        "textual": "hit",
    }
    assert embed(cold) == plain
    assert embed(warm) == plain  # bit-identical: the same optimised graph
    assert not any(p.name.startswith(".staging") for p in cache.iterdir())


def test_cache_key_follows_the_model_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    cache = tmp_path / "cache"
    load(model, optimized_model_cache_dir=str(cache))
    assert (
        load(model, optimized_model_cache_dir=str(cache)).get_statistics()["optimized_model_cache"][
            "visual"
        ]
        == "hit"
    )
    # Replacing the file (same content, new inode/mtime) must not reuse the old entry.
    data = (model / "visual.onnx").read_bytes()
    (model / "visual.onnx").unlink()
    (model / "visual.onnx").write_bytes(data)
    states = load(model, optimized_model_cache_dir=str(cache)).get_statistics()[
        "optimized_model_cache"
    ]
    assert states == {"visual": "written", "textual": "hit"}
    assert len(list(cache.iterdir())) == 2  # the old file's entry went: no load can use it
    # Another optimisation level is another entry.
    states = load(
        model, optimized_model_cache_dir=str(cache), optimization_level="basic"
    ).get_statistics()["optimized_model_cache"]
    assert states == {"visual": "written", "textual": "written"}


def test_the_cache_forgets_models_that_changed_or_went(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """When an entry is written, this machine's entries of models whose files are gone go; an
    entry of a model still on disk stays, whatever runtime or CPU wrote it, and so does one
    another machine wrote (a cache shared between environments or machines must not thrash); a
    staging folder a crashed loader left a day ago goes, a fresh one (a loader writing now)
    stays. Nothing the cache did not write is ever removed: not a folder of another name, not
    a file put into an entry, not what a symbolic link points to."""
    cache = tmp_path / "cache"
    gone, kept, other = (tmp_path / name for name in ("gone", "kept", "other"))
    for model in (gone, kept, other):
        shutil.copytree(tiny_model_dir, model)
    load(gone, optimized_model_cache_dir=str(cache))
    load(kept, optimized_model_cache_dir=str(cache))

    def entries() -> dict[Path, dict[str, str]]:
        return {
            e: json.loads((e / "source.json").read_text())
            for e in cache.iterdir()
            if (e / "source.json").is_file()
        }

    def owners() -> list[str]:
        return sorted(Path(source["model"]).parent.name for source in entries().values())

    assert owners() == ["gone", "gone", "kept", "kept"]
    kept_entry = next(e for e, source in entries().items() if "kept" in source["model"])
    shutil.copytree(kept_entry, cache / ("f" * 32))  # another runtime's entry for kept's files
    gone_entry, gone_source = next((e, s) for e, s in entries().items() if "gone" in s["model"])
    (gone_entry / "notes.txt").write_text("a file of the user's, put into an entry")
    elsewhere = cache / ("e" * 32)  # another machine's entry of a model not on this one
    shutil.copytree(gone_entry, elsewhere)
    (elsewhere / "source.json").write_text(json.dumps({**gone_source, "host": "elsewhere"}))
    mine = cache / "my-project"  # the user's folder, a look-alike of an entry
    mine.mkdir()
    (mine / "source.json").write_text(json.dumps(gone_source))
    (mine / "model.onnx").write_text("the user's")
    outside = tmp_path / "outside"  # a symlinked kind folder: never followed
    (outside / ("d" * 32)).mkdir(parents=True)
    (outside / ("d" * 32) / "source.json").write_text(json.dumps(gone_source))
    (cache / "canary").symlink_to(outside)
    crashed, writing = cache / f".staging-{'a' * 32}", cache / f".staging-{'b' * 32}"
    foreign_staging = cache / ".staging-notes"  # not a name of ours: never touched
    for folder in (crashed, writing, foreign_staging):
        folder.mkdir()
    (crashed / "model.onnx").write_text("half an entry")
    lookalike = cache / f".staging-{'c' * 32}"  # our name, the user's files in it
    (lookalike / "mine").mkdir(parents=True)
    (lookalike / "mine" / "x.txt").write_text("the user's")
    day_ago = time.time() - 25 * 3600
    for folder in (crashed, lookalike):
        os.utime(folder, (day_ago, day_ago))
    os.utime(foreign_staging, (day_ago, day_ago))
    shutil.rmtree(gone)
    load(kept, optimized_model_cache_dir=str(cache))  # all hits: nothing written, nothing pruned
    assert owners() == ["gone", "gone", "gone", "gone", "kept", "kept", "kept"]
    load(other, optimized_model_cache_dir=str(cache))
    assert owners() == ["gone", "gone", "kept", "kept", "kept", "other", "other"]
    assert elsewhere.is_dir() and (mine / "model.onnx").read_text() == "the user's"
    assert sorted(p.name for p in gone_entry.iterdir()) == ["notes.txt"]  # ours went, not theirs
    assert (outside / ("d" * 32) / "source.json").is_file()
    assert writing.is_dir() and foreign_staging.is_dir() and not crashed.exists()
    assert (lookalike / "mine" / "x.txt").read_text() == "the user's"  # only our files go
    states = load(kept, optimized_model_cache_dir=str(cache)).get_statistics()
    assert set(states["optimized_model_cache"].values()) == {"hit"}


def test_a_damaged_cache_entry_is_rebuilt(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    plain = embed(load(tiny_model_dir))
    load(tiny_model_dir, optimized_model_cache_dir=str(cache))
    for entry in cache.iterdir():
        (entry / "model.onnx").write_bytes(b"garbage, not a protobuf")
    with caplog.at_level(logging.WARNING, logger="themis_clip.runtime"):
        p = load(tiny_model_dir, optimized_model_cache_dir=str(cache))
    assert "rebuilding" in caplog.text
    assert set(p.get_statistics()["optimized_model_cache"].values()) == {"written"}
    assert embed(p) == plain
    assert set(
        load(tiny_model_dir, optimized_model_cache_dir=str(cache))
        .get_statistics()["optimized_model_cache"]
        .values()
    ) == {"hit"}


def test_an_unwritable_cache_never_fails_the_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder should be")
    p = load(tiny_model_dir, optimized_model_cache_dir=str(blocker / "cache"))
    assert set(p.get_statistics()["optimized_model_cache"].values()) == {
        "failed: cache folder not writable"
    }
    assert embed(p) == embed(load(tiny_model_dir))


def test_cache_is_not_used_with_memory_mapped_loading(tiny_model_dir: Path, tmp_path: Path) -> None:
    p = OnnxClipPlugin()
    assert p.initialize(
        PluginConfig.from_dict(
            {
                "model": {
                    "path": str(tiny_model_dir),
                    "enable_mmap_loading": True,
                    "mmap_cache_dir": str(tmp_path / "mmap"),
                },
                "session": {"optimized_model_cache_dir": str(tmp_path / "cache")},
            }
        )
    )
    stats = p.get_statistics()
    assert stats["loading_mode"] == "mmap", stats["loading_note"]
    assert set(stats["optimized_model_cache"].values()) == {"off"}
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("same_time", [False, True], ids=["new-mtime", "mtime-restored"])
def test_an_entry_changed_in_place_to_the_same_size_is_rebuilt(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, same_time: bool
) -> None:
    """Weights overwritten in place load fine and give other vectors: the entry's stamp (size,
    mtime, inode and CRC-32 of its files as written) tells, and the entry is rebuilt, also
    when the damage kept the file's time (bit rot, a restore that keeps timestamps)."""
    cache = tmp_path / "cache"
    plain = embed(load(tiny_model_dir))
    load(tiny_model_dir, optimized_model_cache_dir=str(cache))
    for entry in cache.iterdir():
        weights = entry / "model.data" if (entry / "model.data").is_file() else entry / "model.onnx"
        st = weights.stat()
        data = bytearray(weights.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(64)  # the same size, other weights
        weights.write_bytes(bytes(data))
        if same_time:
            os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="themis_clip.runtime"):
        p = load(tiny_model_dir, optimized_model_cache_dir=str(cache))
    assert "changed since written" in caplog.text
    assert set(p.get_statistics()["optimized_model_cache"].values()) == {"written"}
    assert embed(p) == plain


def test_a_model_rewritten_with_its_size_and_time_kept_gets_entries_of_its_own(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The cache key holds the model's identity digest (its files' SHA-256 where it has no
    manifest, computed at every load): other weights under the same name, size, time and
    inode never load the old weights' entry."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "manifest.json").unlink()
    cache = str(tmp_path / "cache")
    before = embed(load(model, optimized_model_cache_dir=cache))
    visual = model / "visual.onnx"
    st = visual.stat()
    proto = onnx.load(str(visual))
    weights = max(proto.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    weights.CopyFrom(
        onnx.numpy_helper.from_array(-onnx.numpy_helper.to_array(weights), weights.name)
    )
    data = proto.SerializeToString()
    assert len(data) == st.st_size
    with open(visual, "r+b") as f:  # in place: the same inode
        f.write(data)
    os.utime(visual, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (visual.stat().st_ino, visual.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    plain = embed(load(model))
    assert plain[0] != before[0]
    cached = load(model, optimized_model_cache_dir=cache)
    assert cached.get_statistics()["optimized_model_cache"]["visual"] == "written"
    assert embed(cached) == plain
