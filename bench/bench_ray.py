"""embed-dataset on Ray (local, 2 CPUs) with 1 and 2 actors vs the single-process pipeline.

ViT-B/32-architecture image tower, 512 photo-like 640x480 JPEGs (64 distinct), batch 16. Each actor gets
``intra_op_threads = 2 / actors`` so the machine's 2 cores are not oversubscribed. Ray's own
start-up (about 5 s) is included in the Ray figures and reported separately.

Run: .venv/bin/python bench/bench_ray.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import photos
from make_models import ensure

from themis_clip import OnnxClipPlugin, PluginConfig
from themis_clip.distributed import embed_dataset


def main() -> None:
    import ray

    model = ensure("vit-b-32")
    folder = Path(__file__).resolve().parent / "data" / "jpeg-640x480-512"
    if not folder.exists():
        source = Path(__file__).resolve().parent / "data" / "jpeg-640x480"
        photos(source, 64)
        folder.mkdir(parents=True)
        for i, f in enumerate(sorted(source.glob("*.jpg")) * 8):
            shutil.copy(f, folder / f"{i:03d}.jpg")
    files = sorted(str(p) for p in folder.glob("*.jpg"))
    plugin = OnnxClipPlugin()
    assert plugin.initialize(
        PluginConfig.from_dict({"model": {"path": str(model)}, "max_batch_size": 16})
    )
    plugin.generate_embedding_batch(files[:16])
    t0 = time.perf_counter()
    assert all(r.ok for r in plugin.generate_embedding_batch(files))
    single = len(files) / (time.perf_counter() - t0)
    plugin.shutdown()
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    startup = time.perf_counter() - t0
    rates = {}
    try:
        for actors in (1, 2):
            config = {
                "model": {"path": str(model)},
                "max_batch_size": 16,
                "intra_op_threads": 2 // actors,
            }
            with tempfile.TemporaryDirectory() as tmp:
                report = embed_dataset(
                    str(folder),
                    Path(tmp) / "out",
                    config,
                    actors=actors,
                    batch_size=16,
                    num_cpus_per_actor=2 / actors,
                )
                assert report.embedded == len(files)
                rates[actors] = report.rate
    finally:
        ray.shutdown()
    print(
        f"{len(files)} JPEGs 640x480, ViT-B/32 arch: single process {single:.1f} img/s; "
        f"Ray 1 actor {rates[1]:.1f} img/s (x{rates[1] / single:.2f}), "
        f"2 actors {rates[2]:.1f} img/s (x{rates[2] / single:.2f}); Ray start-up {startup:.1f} s"
    )
    print(
        json.dumps(
            {
                "single_img_s": single,
                "ray_1_actor_img_s": rates[1],
                "ray_2_actors_img_s": rates[2],
                "ray_startup_s": startup,
                "images": len(files),
            }
        )
    )


if __name__ == "__main__":
    main()
