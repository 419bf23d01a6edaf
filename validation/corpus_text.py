"""The built-in long text for depth, long-prompt and corpus-KLD validation, or a user's text file.

``validation/data/botchan.txt``: the opening chapters of Botchan (Natsume Soseki, translated by Yasotaro Morri,
1919; public domain), from Project Gutenberg EBook #8868 as shipped in the sentencepiece 0.2.3 source distribution on
PyPI (``test/botchan.txt``). About 22 KB of prose: ~5,000 tokens for SmolLM2's and Gemma 3's tokenizers, past
Gemma 3's 512-token sliding window and enough for ``--depth 2000`` and several 512-token perplexity windows.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from inference_engine.errors import GGUFParityError, read_user_text

BUILTIN_NAME = "builtin:botchan"


def builtin_text() -> str:
    """The shipped excerpt without its ``# `` header lines."""
    raw = resources.files("validation").joinpath("data/botchan.txt").read_text(encoding="utf-8")
    return "\n".join(line for line in raw.splitlines() if not line.startswith("# ")) + "\n"


def load_text(path: str | None) -> tuple[str, str]:
    """``(text, source)``: a UTF-8 text file, or the built-in excerpt when ``path`` is None."""
    if path is None:
        return builtin_text(), BUILTIN_NAME
    p = Path(path)
    text = read_user_text(p, "text file", "give a UTF-8 .txt file, or no file for the built-in text")
    if not text.strip():
        raise GGUFParityError(f"{path}: the text file is empty")
    return text, str(p)
