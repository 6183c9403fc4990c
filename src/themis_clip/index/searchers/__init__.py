"""Searchers: the :class:`~.base.Searcher` protocol, a local one (:mod:`.local`) and a
PostgreSQL one (:mod:`.postgres`). The two never import each other (import-linter)."""
