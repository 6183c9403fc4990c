"""One router per resource: ``ops`` (health, stats, metrics, page), ``embeddings`` (OpenAI API and
plain embedding), ``search`` (index items, search, thumbnails), ``admin`` (hot swap)."""
