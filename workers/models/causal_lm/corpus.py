"""The training text: the project's own prose, snapshotted into ``data/corpus.txt``.

The model is trained on text Gristmill wrote itself (its Markdown documents and the
docstrings and comments of its Python code), so the weights carry no third-party
licence and rebuild without the internet. The snapshot is what training reads;
``python -m workers.models.causal_lm.corpus`` refreshes it from a checkout.
Documents are joined by ``END_OF_TEXT`` so the model learns where a text ends.
Prose only: code blocks and tables are left out and wrapped lines are joined into
their paragraph, so a small model spends its few minutes of training on sentences,
not on runs of newlines and table cells.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from core.models.lm_codec import END_OF_TEXT

DATA_DIR = Path(__file__).with_name("data")
CORPUS_PATH = DATA_DIR / "corpus.txt"
# Folders whose files are not the project's own words (fetched jars, environments).
_SKIP = {".venv", ".git", "node_modules", "libs", ".gristmill", "data", "results"}


def _files(root: Path, suffix: str) -> list[Path]:
    out = []
    for path in root.rglob(f"*{suffix}"):
        if not any(part in _SKIP or part.startswith(".") for part in path.relative_to(root).parts):
            out.append(path)
    return sorted(out)


def _python_prose(source: str) -> Iterator[str]:
    """Docstrings, then comment paragraphs (consecutive comment lines joined)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                yield doc
    paragraph: list[str] = []
    last_line = -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        text = tok.string.lstrip("#").strip()
        if text.startswith(("noqa", "type:", "pragma")) or not text:
            continue
        if tok.start[0] != last_line + 1 and paragraph:
            yield " ".join(paragraph)
            paragraph = []
        paragraph.append(text)
        last_line = tok.start[0]
    if paragraph:
        yield " ".join(paragraph)


_BLOCK_START = re.compile(r"^(#{1,6} |[-*+] |\d+[.)] )")


def prose(text: str) -> str:
    """Paragraphs of ``text`` one per line (list items and headings on their own),
    without fenced code blocks, indented code or table rows."""
    out: list[str] = []
    para: list[str] = []
    fenced = False

    def flush() -> None:
        if para:
            out.append(" ".join(para))
            para.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("```", "~~~")):
            fenced = not fenced
            flush()
            continue
        if fenced or line.startswith("|") or (raw.startswith("    ") and not para):
            continue
        if not line:
            flush()
        elif _BLOCK_START.match(line):
            flush()
            para.append(line)
        else:
            para.append(line)
    flush()
    return "\n".join(p for p in out if len(p) > 1)


def documents(root: Path) -> Iterator[str]:
    for path in _files(root, ".md"):
        text = prose(path.read_text(encoding="utf-8"))
        if text:
            yield text
    for path in _files(root, ".py"):
        parts = [prose(p) for p in _python_prose(path.read_text(encoding="utf-8"))]
        text = "\n".join(p for p in parts if len(p) > 40)
        if text:
            yield text


def build(root: Path) -> str:
    return END_OF_TEXT.join(d + "\n" for d in documents(root))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="a checkout of the repository")
    ap.add_argument("--out", type=Path, default=CORPUS_PATH)
    args = ap.parse_args()
    text = build(args.root)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {len(text.encode()):,} bytes")


if __name__ == "__main__":
    main()
