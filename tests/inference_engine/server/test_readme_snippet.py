"""The README's ``openai`` client snippet runs as written against our server (tiny model, local URL)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the snippet uses the openai client (pip install -e '.[test]')")

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_openai_snippet_runs(tiny_server, capsys):
    section = README.read_text().split("## Serving", 1)[1]
    snippet = section.split("```python", 1)[1].split("```", 1)[0]
    assert "http://127.0.0.1:8080/v1" in snippet and "smollm2-135m" in snippet
    code = snippet.replace("http://127.0.0.1:8080/v1", f"{tiny_server.url}/v1").replace(
        "smollm2-135m", str(tiny_server.model_path))
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102  (the README snippet, run as a user would)
    assert capsys.readouterr().out.strip()
