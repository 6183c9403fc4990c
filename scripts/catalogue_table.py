"""Write the catalogue table of docs/getting-a-model.md from the package's catalogue.json.

The table sits between ``<!-- catalogue:start -->`` and ``<!-- catalogue:end -->``; it is
generated, never edited by hand, so it cannot drift from the data ``--model NAME`` uses.

    .venv/bin/python scripts/catalogue_table.py           # rewrite the table
    .venv/bin/python scripts/catalogue_table.py --check   # exit 1 if the page is stale (CI)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from themis_clip.models.catalogue import CatalogueEntry, catalogue  # noqa: E402

PAGE = ROOT / "docs" / "getting-a-model.md"
START, END = "<!-- catalogue:start -->", "<!-- catalogue:end -->"


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, tuple):
        return ", ".join(value)
    return str(value).replace("|", "\\|")


def table(entries: tuple[CatalogueEntry, ...]) -> str:
    lines = [
        "| name | repo | layout | family | dim | image | context | languages | licence |",
        "|---|---|---|---|---:|---:|---:|---|---|",
    ]
    for e in entries:
        repo = e.repo + (f" + {e.text_repo}" if e.text_repo else "")
        lines.append(
            "| "
            + " | ".join(
                _cell(v)
                for v in (
                    f"`{e.name}`",
                    repo,
                    e.layout,
                    e.family,
                    e.embedding_dim,
                    e.image_size,
                    e.context_length,
                    e.languages,
                    e.license,
                )
            )
            + " |"
        )
    return "\n".join(lines)


def render(page: str) -> str:
    head, sep, rest = page.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{PAGE}: markers {START} / {END} not found")
    return f"{head}{START}\n{table(catalogue())}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is stale")
    args = parser.parse_args()
    page = PAGE.read_text("utf-8")
    new = render(page)
    if args.check:
        if new != page:
            print(f"{PAGE} is stale: run scripts/catalogue_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, "utf-8")
    print(f"wrote {len(catalogue())} models into {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
