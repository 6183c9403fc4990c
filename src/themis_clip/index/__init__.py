"""The vector store and search use cases (never imports model code: it speaks vectors)."""
