"""Every embedding dialect through its official client against the real server: Ollama
(``ollama``), text-embeddings-inference (``huggingface_hub.InferenceClient``), Cohere v2
(``cohere``), vLLM's chat form (``openai`` with ``extra_body``) and Jina's typed inputs; the
same vector through every door, and the same keys, scopes and limits."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import numpy.typing as npt
import ollama
import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from PIL import Image

from tests.helpers import ServerProcess, encode, new_key, photo_like

pytestmark = pytest.mark.slow  # real server processes

TEXTS = ["a red circle", "a photo of a dog on the beach", "x"]
LONG = " ".join(["word"] * 200)  # over the 77-token context


def data_url(seed: int = 0) -> str:
    png = encode(Image.fromarray(photo_like(60, 45, seed)), "PNG")
    return "data:image/png;base64," + base64.b64encode(png).decode()


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess(["--model", str(tiny_model_dir), "--no-warmup"]) as s:
        yield s


@pytest.fixture(scope="module")
def model_id(server: ServerProcess) -> str:
    return str(httpx.get(f"{server.base}/v1/models").json()["data"][0]["id"])


def reference(base: str, inputs: list[str]) -> npt.NDArray[np.float32]:
    """``/v1/embeddings``' vectors, the door every other is held to."""
    r = httpx.post(f"{base}/v1/embeddings", json={"input": inputs}, timeout=30)
    assert r.status_code == 200, r.text
    return np.asarray([row["embedding"] for row in r.json()["data"]], dtype=np.float32)


def same(got: Any, want: npt.NDArray[np.float32]) -> None:
    """Bit-equal float32 vectors."""
    assert np.asarray(got, dtype=np.float32).tobytes() == want.tobytes()


def test_ollama_client(server: ServerProcess, model_id: str) -> None:
    client = ollama.Client(host=server.base)
    inputs = [*TEXTS, data_url()]
    r = client.embed(model=model_id, input=inputs)
    same(r.embeddings, reference(server.base, inputs))
    assert r.model == model_id and r.prompt_eval_count and r.prompt_eval_count > 0
    same(client.embed(model=model_id, input=TEXTS[0]).embeddings, reference(server.base, TEXTS[:1]))
    assert client.embed(model=model_id, input="").embeddings == []  # Ollama's load-only call
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model=model_id, input=TEXTS, dimensions=7)
    assert err.value.status_code == 422 and "cannot be shortened" in str(err.value)
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model="llama3", input=TEXTS)
    assert err.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model=model_id, input=[LONG], truncate=False)
    assert err.value.status_code == 422 and "TextTooLong" in str(err.value)
    same(client.embed(model=model_id, input=[LONG]).embeddings, reference(server.base, [LONG]))


def test_tei_through_huggingface_hub(server: ServerProcess) -> None:
    client = InferenceClient(model=f"{server.base}/embed")
    inputs = [*TEXTS, data_url(1)]
    got = client.feature_extraction(inputs)  # type: ignore[arg-type]
    assert got.dtype == np.float32 and got.shape[0] == len(inputs)
    same(got, reference(server.base, inputs))
    same(client.feature_extraction(TEXTS[1]), reference(server.base, TEXTS[1:2]))
    # TEI refuses a long text unless truncate is on; so does this door
    with pytest.raises(HfHubHTTPError) as err:
        client.feature_extraction(LONG)
    assert "422" in str(err.value)
    same(client.feature_extraction(LONG, truncate=True), reference(server.base, [LONG]))
    for kwargs in ({"normalize": False}, {"truncation_direction": "left"}):
        with pytest.raises(HfHubHTTPError) as err:
            client.feature_extraction(TEXTS[0], **kwargs)  # type: ignore[arg-type]
        assert "422" in str(err.value)


def test_cohere_v2_client(server: ServerProcess, model_id: str) -> None:
    client = cohere.ClientV2(api_key="unused", base_url=server.base)
    kinds = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    r = client.embed(
        model=model_id, input_type="search_document", texts=TEXTS, embedding_types=kinds
    )
    want = reference(server.base, TEXTS)
    e = r.embeddings
    same(e.float_, want)
    assert r.texts == TEXTS and r.response_type == "embeddings_by_type"
    # int8: each vector scaled to 127 at its largest component; binary: signs, 8 to a byte
    scaled = np.rint(want / np.abs(want).max(axis=1, keepdims=True) * 127)
    assert np.array_equal(np.asarray(e.int8), scaled)
    assert np.array_equal(np.asarray(e.uint8), scaled + 128)
    bits = np.packbits(want > 0, axis=1).astype(int)
    assert np.array_equal(np.asarray(e.ubinary), bits)
    assert np.array_equal(np.asarray(e.binary), bits - 128)
    assert e.base64 is not None
    same([np.frombuffer(base64.b64decode(b), "<f4") for b in e.base64], want)
    cos = (np.asarray(e.int8, dtype=np.float32) * want).sum(1) / np.linalg.norm(scaled, axis=1)
    assert cos.min() > 0.999

    images = [data_url(2), data_url(3)]
    r = client.embed(model=model_id, input_type="image", images=images, embedding_types=["float"])
    same(r.embeddings.float_, reference(server.base, images))
    inputs: list[Any] = [
        {"content": [{"type": "text", "text": TEXTS[0]}]},
        {"content": [{"type": "image_url", "image_url": {"url": images[0]}}]},
    ]
    r = client.embed(model=model_id, input_type="search_query", inputs=inputs)
    same(r.embeddings.float_, reference(server.base, [TEXTS[0], images[0]]))

    fused = [
        {
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": images[0]}},
            ]
        }
    ]
    with pytest.raises(cohere.UnprocessableEntityError) as err:
        client.embed(model=model_id, input_type="search_query", inputs=fused)  # type: ignore[arg-type]
    assert "cannot fuse" in str(err.value.body)
    with pytest.raises(cohere.UnprocessableEntityError):
        client.embed(model=model_id, input_type="search_query", texts=[LONG], truncate="NONE")
    with pytest.raises(cohere.NotFoundError):
        client.embed(model="embed-v4.0", input_type="search_query", texts=TEXTS)


def test_vllm_messages_through_openai_extra_body(server: ServerProcess, model_id: str) -> None:
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)
    image = data_url(4)
    for content, want in (
        ([{"type": "image_url", "image_url": {"url": image}}], [image]),
        ([{"type": "text", "text": TEXTS[1]}], [TEXTS[1]]),
        (TEXTS[2], [TEXTS[2]]),
    ):
        r = client.embeddings.create(
            model=model_id,
            input=[],
            encoding_format="float",
            extra_body={"messages": [{"role": "user", "content": content}]},
        )
        same([d.embedding for d in r.data], reference(server.base, want))
    both = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": image}}]
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.embeddings.create(
            model=model_id, input=[], extra_body={"messages": [{"role": "user", "content": both}]}
        )
    assert "one text or one image" in str(err.value)


def test_jina_typed_inputs(server: ServerProcess, model_id: str) -> None:
    image = data_url(5)
    bare = image.split(",", 1)[1]  # Jina also takes bare base64 for an image
    body = {"model": model_id, "input": [{"text": TEXTS[0]}, {"image": bare}, {"image": image}]}
    r = httpx.post(f"{server.base}/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 200, r.text
    same(
        [d["embedding"] for d in r.json()["data"]], reference(server.base, [TEXTS[0], image, image])
    )
    body = {"input": [{"text": "a", "image": bare}]}
    r = httpx.post(f"{server.base}/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 422 and "one of text or image" in r.json()["error"]["message"]
    for item, modality in (({"image": bare}, "text"), ({"text": TEXTS[0]}, "image")):
        body = {"input": [item], "modality": modality}
        r = httpx.post(f"{server.base}/v1/embeddings", json=body, timeout=30)
        assert r.status_code == 422 and "modality" in r.json()["error"]["message"], r.text


def test_a_data_url_that_is_not_an_image_is_refused_not_read_as_a_caption(
    server: ServerProcess,
) -> None:
    text_url = "data:text/plain;base64,aGVsbG8="
    for route, body in (
        ("/v1/embeddings", {"input": [text_url]}),
        ("/api/embed", {"model": "tiny-a", "input": [text_url]}),
        ("/embed", {"inputs": [text_url]}),
    ):
        r = httpx.post(f"{server.base}{route}", json=body, timeout=30)
        assert r.status_code == 415, (route, r.status_code, r.text)
        assert "text/plain" in r.json()["error"]["message"], (route, r.text)
    # a caption that merely begins with the word stays a caption
    r = httpx.post(f"{server.base}/v1/embeddings", json={"input": ["data: a chart"]}, timeout=30)
    assert r.status_code == 200, r.text


def test_scopes_and_limits_apply_to_every_door(tiny_model_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    search, metrics = new_key(keys, "search", "app"), new_key(keys, "metrics", "prom")
    args = ["--model", str(tiny_model_dir), "--no-warmup", "--keys", str(keys)]
    with ServerProcess([*args, "--max-json-mb", "0.05"]) as s:
        mid = str(
            httpx.get(f"{s.base}/v1/models", headers={"Authorization": f"Bearer {search}"}).json()[
                "data"
            ][0]["id"]
        )
        doors: list[tuple[str, dict[str, Any]]] = [
            ("/api/embed", {"model": mid, "input": TEXTS}),
            ("/embed", {"inputs": TEXTS}),
            ("/v2/embed", {"model": mid, "input_type": "search_query", "texts": TEXTS}),
            ("/v1/embeddings", {"model": mid, "input": [{"text": TEXTS[0]}]}),
        ]
        for path, body in doors:
            url = f"{s.base}{path}"
            r = httpx.post(url, json=body, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["type"] == "Unauthorized", path
            r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {metrics}"})
            assert r.status_code == 403 and "search" in r.json()["error"]["message"], path
            auth = {"Authorization": f"Bearer {search}"}
            assert httpx.post(url, json=body, headers=auth, timeout=30).status_code == 200, path
            big = {k: ([LONG] * 300 if isinstance(v, list) else v) for k, v in body.items()}
            r = httpx.post(url, json=big, headers=auth, timeout=30)
            assert r.status_code == 413, path  # the JSON body limit
            many = {k: (["x"] * 2049 if isinstance(v, list) else v) for k, v in body.items()}
            if path == "/v1/embeddings":
                many["input"] = ["x"] * 2049
            r = httpx.post(url, json=many, headers=auth, timeout=30)
            assert r.status_code in (413, 422) and "error" in r.json(), path
        # each official client carries the key its own way
        auth = {"Authorization": f"Bearer {search}"}
        assert ollama.Client(host=s.base, headers=auth).embed(model=mid, input="a").embeddings
        assert InferenceClient(model=f"{s.base}/embed", token=search).feature_extraction("a").size
        co = cohere.ClientV2(api_key=search, base_url=s.base)
        assert co.embed(model=mid, input_type="search_query", texts=["a"]).embeddings.float_
        with pytest.raises(cohere.UnauthorizedError):
            cohere.ClientV2(api_key="tck_wrong", base_url=s.base).embed(
                model=mid, input_type="search_query", texts=["a"]
            )
