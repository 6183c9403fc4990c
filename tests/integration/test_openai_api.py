"""The official ``openai`` client against the real server (a ``themis-clip serve`` process)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image
from tokenizers import Tokenizer

from tests.helpers import ServerProcess, photo_like
from themis_clip import OnnxClipPlugin, PluginConfig

TEXTS = ["a red circle", "a photo of a dog on the beach", "x"]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess(["--model", str(tiny_model_dir), "--no-warmup"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def plugin(tiny_model_dir: Path) -> Iterator[OnnxClipPlugin]:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(tiny_model_dir)}}))
    yield p
    p.shutdown()


def test_models_list_and_retrieve(client: openai.OpenAI, plugin: OnnxClipPlugin) -> None:
    models = client.models.list().data
    identity = plugin.model_identity
    assert identity is not None
    assert [m.id for m in models] == [identity.model_id]
    card = models[0].model_dump()
    assert card["embedding_dim"] == identity.embedding_dim
    assert card["modalities"] == ["image", "text"] and card["owned_by"] == "themis-clip"
    assert client.models.retrieve(identity.model_id).id == identity.model_id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_text_embeddings_and_usage(
    client: openai.OpenAI, plugin: OnnxClipPlugin, tiny_model_dir: Path
) -> None:
    model_id = client.models.list().data[0].id
    for encoding in ("float", "base64"):  # the client asks for base64 by default and decodes it
        r = client.embeddings.create(model=model_id, input=TEXTS, encoding_format=encoding)  # type: ignore[arg-type]
        ours = plugin.generate_text_embedding_batch(TEXTS)
        for row, mine in zip(r.data, ours, strict=True):
            got = (
                np.frombuffer(base64.b64decode(row.embedding), "<f4")  # type: ignore[arg-type]
                if isinstance(row.embedding, str)
                else np.asarray(row.embedding, dtype=np.float32)
            )
            assert np.allclose(got, mine.embedding, atol=1e-6)
        assert r.model == model_id
    # Usage counts the token positions the text tower ran: start + text tokens + end.
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    expected = sum(len(tok.encode(t, add_special_tokens=False).ids) + 2 for t in TEXTS)
    r = client.embeddings.create(model=model_id, input=TEXTS, encoding_format="float")
    assert r.usage.prompt_tokens == expected == r.usage.total_tokens


def test_images_through_the_client(client: openai.OpenAI, plugin: OnnxClipPlugin) -> None:
    buf = io.BytesIO()
    Image.fromarray(photo_like(64, 48, 3)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    r = client.embeddings.create(
        model=client.models.list().data[0].id,
        input=[url],
        encoding_format="float",
        extra_body={"modality": "image"},
    )
    mine = plugin.generate_embedding(buf.getvalue()).embedding
    assert np.allclose(np.asarray(r.data[0].embedding, dtype=np.float32), mine, atol=1e-6)
    assert r.usage.prompt_tokens == 0


def test_dimensions(client: openai.OpenAI, plugin: OnnxClipPlugin) -> None:
    identity = plugin.model_identity
    assert identity is not None
    dim = identity.embedding_dim
    r = client.embeddings.create(
        model=identity.model_id, input="a", dimensions=dim, encoding_format="float"
    )
    assert len(r.data[0].embedding) == dim
    with pytest.raises(openai.UnprocessableEntityError, match="cannot be shortened"):
        client.embeddings.create(model=identity.model_id, input="a", dimensions=dim - 1)


def test_a_fifo_in_place_of_the_manifest_does_not_block_requests(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # Naming a model reads the served model's manifest (the repo it declares) at each request,
    # on the event loop: a FIFO there used to wait for a writer with every request behind it.
    import os
    import shutil

    import httpx

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    with ServerProcess(["--model", str(model), "--no-warmup"]) as s:
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        os.replace(fifo, model / "manifest.json")
        r = httpx.get(f"{s.base}/v1/models/someone-else", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert httpx.get(f"{s.base}/healthz", timeout=10).status_code == 200
