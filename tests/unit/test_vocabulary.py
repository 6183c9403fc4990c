"""The shared vocabulary: the model identity a precision variant gets."""

from __future__ import annotations

from themis_clip.vocabulary import ModelIdentity


def test_a_precision_variant_is_another_identity() -> None:
    fp32 = ModelIdentity.of_variant(name="m", sha256="ab" * 32, embedding_dim=64)
    assert fp32 == ModelIdentity(name="m", sha256="ab" * 32, embedding_dim=64)  # indexes as before
    int8 = ModelIdentity.of_variant(name="m", sha256="ab" * 32, embedding_dim=64, variant="int8")
    assert int8.name == "m-int8" and int8.sha256 not in (fp32.sha256, "")
    fp16 = ModelIdentity.of_variant(name="m", sha256="ab" * 32, embedding_dim=64, variant="fp16")
    assert len({fp32.sha256, int8.sha256, fp16.sha256}) == 3
