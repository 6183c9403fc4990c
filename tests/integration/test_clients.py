"""langchain-openai, llama-index and litellm against the real server (the set-ups docs/clients.md
shows); the ``openai`` client has its own file, test_openai_api.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from tests.helpers import ServerProcess
from themis_clip import OnnxClipPlugin, PluginConfig

# Each test starts real processes (a `themis-clip serve`, a Hub stand-in): the slower set.
pytestmark = pytest.mark.slow

TEXTS = ["a red circle", "a blue square on the left"]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess(["--model", str(tiny_model_dir), "--no-warmup"]) as s:
        yield s


@pytest.fixture(scope="module")
def plugin(tiny_model_dir: Path) -> Iterator[OnnxClipPlugin]:
    p = OnnxClipPlugin()
    assert p.initialize(PluginConfig.from_dict({"model": {"path": str(tiny_model_dir)}}))
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def model_id(plugin: OnnxClipPlugin) -> str:
    identity = plugin.model_identity
    assert identity is not None
    return identity.model_id


def _same(got: list[list[float]], plugin: OnnxClipPlugin) -> None:
    want = [r.embedding for r in plugin.generate_text_embedding_batch(TEXTS)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert np.allclose(np.asarray(g, dtype=np.float32), w, atol=1e-5)


def test_langchain_openai(server: ServerProcess, plugin: OnnxClipPlugin, model_id: str) -> None:
    from langchain_openai import OpenAIEmbeddings

    emb = OpenAIEmbeddings(
        model=model_id,
        base_url=f"{server.base}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,  # send strings: CLIP tokenises text itself
        max_retries=0,
    )
    _same(emb.embed_documents(TEXTS), plugin)
    _same([emb.embed_query(TEXTS[0]), emb.embed_query(TEXTS[1])], plugin)


def test_token_arrays_get_a_422_that_names_the_langchain_setting(
    server: ServerProcess, model_id: str
) -> None:
    # What langchain's default (check_embedding_ctx_length=True) sends: tiktoken ids.
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)
    for token_input in ([[9, 8, 7], [1, 2]], [5, 6, 7]):
        with pytest.raises(openai.UnprocessableEntityError) as err:
            client.embeddings.create(model=model_id, input=token_input)  # type: ignore[arg-type]
        message = str(err.value)
        assert "CLIP tokenises text itself" in message
        assert "check_embedding_ctx_length=False" in message


def test_llama_index(server: ServerProcess, plugin: OnnxClipPlugin, model_id: str) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    emb = OpenAIEmbedding(
        model_name=model_id, api_base=f"{server.base}/v1", api_key="unused", max_retries=0
    )
    _same(emb.get_text_embedding_batch(TEXTS), plugin)
    _same([emb.get_query_embedding(t) for t in TEXTS], plugin)


def test_litellm(
    server: ServerProcess, plugin: OnnxClipPlugin, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no price list fetch
    import litellm

    r = litellm.embedding(
        model=f"openai/{model_id}", input=TEXTS, api_base=f"{server.base}/v1", api_key="unused"
    )
    _same([row["embedding"] for row in r.data], plugin)
