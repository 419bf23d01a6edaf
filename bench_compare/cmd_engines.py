"""``bench-compare engines list``: every engine ``--engine`` accepts, from the engine registry
(:mod:`bench_compare.engines`): ours on each backend, llama.cpp, each registered scheme, entry-point plugins."""

from __future__ import annotations

import click


@click.group("engines")
def engines() -> None:
    """Engines: ours on each backend, llama.cpp, registered schemes and plugins."""


@engines.command("list")
def list_cmd() -> None:
    """Print every engine, one a line: the spec to type, what it is, what it gives (its capabilities: what validate
    can check and bench / compare can time), and why it cannot run here if it cannot."""
    from bench_compare.engines import list_engines

    rows = list_engines()
    width = max(len(r.spec) for r in rows)
    for r in rows:
        note = f"  [unavailable: {r.unavailable}]" if r.unavailable else ""
        source = f"  ({r.source})" if r.source != "built in" else ""
        gives = f"  [gives: {', '.join(r.capabilities) if r.capabilities is not None else 'what it declares'}]"
        click.echo(f"{r.spec:<{width}}  {r.description}{source}{gives}{note}".rstrip())
