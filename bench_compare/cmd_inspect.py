"""``bench-compare inspect MODEL``: metadata and a tensor table."""

from __future__ import annotations

import click

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.store.named_models import resolve_model

_LONG_ARRAY = 8  # metadata arrays longer than this (the vocabulary) are summarised, not printed


def _format_value(value) -> str:
    if isinstance(value, list):
        if len(value) > _LONG_ARRAY:
            return f"[{len(value)} items: {', '.join(repr(v) for v in value[:3])}, ...]"
        return repr(value)
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


@click.command("inspect")
@click.argument("model")
@click.option("--no-tensors", is_flag=True, help="Only print metadata.")
def inspect_cmd(model: str, no_tensors: bool) -> None:
    """Print MODEL's metadata and a tensor table (name, type, shape, bytes). MODEL is a name or a .gguf path.

    An invalid file is shown as far as it can be read, then every problem found is listed; exit 2. A valid file
    our engine cannot run (its architecture or a tensor type) is shown in full, saying so; exit 0."""
    f = open_gguf(resolve_model(model), strict=False)
    try:
        _show(f, no_tensors)
    finally:
        if f.unsupported:
            click.echo(f"\nour engine cannot run this file ({len(f.unsupported)}):")
            for reason in f.unsupported:
                click.echo(f"  - {reason}")
        if f.problems:
            click.echo(f"\nproblems ({len(f.problems)}):")
            for problem in f.problems:
                click.echo(f"  - {problem}")
    if f.problems:
        raise GGUFParityError(f"{f.path}: {len(f.problems)} problem(s) found (listed above); "
                              f"this file cannot be run")


def _experts_line(f) -> str | None:
    """A mixture-of-experts file's expert counts in one line (None for a dense model)."""
    n_expert = f.arch_value("expert_count")
    if not n_expert:
        return None
    used = f.arch_value("expert_used_count")
    width = f.arch_value("expert_feed_forward_length")
    shared = any(name.endswith(".ffn_gate_inp_shexp.weight") for name in f.tensors)
    return (f"experts: {n_expert} per layer, {used if used is not None else '?'} used per token"
            + (f", each {width} wide" if width else "") + (", plus a shared expert" if shared else ""))


def _show(f, no_tensors: bool) -> None:
    d = f.describe()
    click.echo(f"file: {d['path']}")
    click.echo(f"architecture: {d['architecture']}  quant: {d['quant']}  params: {d['n_params']:,}  "
               f"size: {d['size_bytes']:,} bytes  tensors: {len(f.tensors)}")
    experts = _experts_line(f)
    if experts:
        click.echo(experts)
    click.echo("\nmetadata:")
    for key, value in f.metadata.items():
        click.echo(f"  {key} = {_format_value(value)}")
    if no_tensors:
        return
    click.echo("\ntensors:")
    width = max(len(n) for n in f.tensors) if f.tensors else 4
    click.echo(f"  {'name':<{width}}  {'type':<5}  {'shape':<18}  {'bytes':>12}")
    for t in f.tensors.values():
        shape = "x".join(str(s) for s in t.shape)
        click.echo(f"  {t.name:<{width}}  {t.type_name:<5}  {shape:<18}  {t.n_bytes:>12,}")
