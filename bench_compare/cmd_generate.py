"""``bench-compare generate [PROMPT]``: generate text with our engine, streaming it as it comes.

The text goes to stdout; one line of timings (prompt tokens, time to first token, decode tokens/s) ends the run on
stderr, so ``bench-compare generate ... > out.txt`` keeps only the text. Greedy unless ``--temperature`` > 0; a
sampled run without ``--seed`` draws one, and the last line names it (and every sampling setting).
Backend, numerics, K/V type and threads default to :data:`inference_engine.defaults.COMMANDS`, as ``serve``'s do,
so both give the same greedy text.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys

import click

from bench_compare.options import (
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    Number,
    device_option,
    given_on_command_line,
    require_at_least,
    table_default,
)
from inference_engine import defaults
from inference_engine.backends import BACKENDS
from inference_engine.errors import GGUFParityError
from inference_engine.registries import numerics_help

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_MODEL = "smollm2-135m"
DEFAULT_CTX = 2048
SAMPLING_ONLY = {"top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}  # click's names -> the flags


def _check_flags(max_tokens: int, ctx: int | None, threads: int | None, backend: str, numerics: str,
                 kv_type: str, device: str | None = None) -> None:
    """Refuse bad flags before anything slow happens (one line each, exit 2)."""
    from inference_engine.backends import resolve_device
    from inference_engine.backends.base import check_kv_type
    from inference_engine.registries import check_numerics

    require_at_least(1, ("--max-tokens", max_tokens), ("--ctx", ctx), ("--threads", threads))
    BACKENDS.validate(backend)
    check_numerics(numerics)
    check_kv_type(kv_type)
    if device is not None:
        resolve_device(backend, device)


def _check_sampling_flags(temperature: float) -> None:
    """--top-k, --top-p and --seed shape sampling; with --temperature 0 (greedy, the default) they would do nothing."""
    given = [flag for name, flag in SAMPLING_ONLY.items() if given_on_command_line(name)]
    if temperature <= 0 and given:
        raise GGUFParityError(f"{', '.join(given)} only apply when sampling, and --temperature is 0 (greedy): give "
                              "--temperature > 0 too")


@click.command("generate")
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Named model or path to a .gguf.")
@click.option("--backend", default=None, help=f"{', '.join(BACKENDS)} (numpy: the readable reference)."
                                             f"{table_default(defaults.COMMANDS, 'backend')}")
@click.option("--numerics", default=None, help=f"{numerics_help()}: f32 dequantized, ggml llama.cpp's."
                                              f"{table_default(defaults.COMMANDS, 'numerics')}")
@device_option()
@click.option("--max-tokens", "-n", default=64, show_default=True, type=POSITIVE, help="Tokens to generate at most.")
@click.option("--ctx", default=None, type=POSITIVE,
              help=f"Context size (KV cache positions); default {DEFAULT_CTX} or the model's training context if "
                   f"smaller; at most the training context.")
@click.option("--threads", "-t", default=None, type=POSITIVE,
              help=f"Threads.{table_default(defaults.COMMANDS, 'threads')}")
@click.option("--kv-type", default=None, help="KV cache storage: f16 (llama.cpp's default) or f32."
                                             f"{table_default(defaults.COMMANDS, 'kv_type')}")
@click.option("--temperature", default=0.0, show_default=True, type=Number(0.0), help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=NON_NEGATIVE,
              help="Keep the k most likely tokens (0 = off).")
@click.option("--top-p", default=1.0, show_default=True, type=Number(0.0, 1.0, lo_open=True),
              help="Nucleus sampling mass (1 = off).")
@click.option("--seed", default=None, type=SEED, help="Random seed for sampling (default: one drawn, then printed).")
@click.option("--chat", is_flag=True, help="Wrap PROMPT in the model's chat template as a user message.")
def generate(
    prompt, model, backend, numerics, max_tokens, ctx, threads, kv_type, temperature, top_k, top_p, seed, chat, device
) -> None:
    """Generate text after PROMPT with our engine (greedy by default); print timings at the end."""
    from inference_engine.engine import OurEngine
    from inference_engine.generate import generate as run_generation
    from inference_engine.gguf.file import open_gguf
    from inference_engine.gguf.validate import check_context, check_model, check_training_context
    from inference_engine.models import check_runnable
    from inference_engine.sampling import Sampler
    from inference_engine.store.named_models import resolve_model

    run = defaults.COMMANDS.resolve(backend=backend, numerics=numerics, kv_type=kv_type, threads=threads,
                                    device=device)
    _check_flags(max_tokens, ctx, run.threads, run.backend, run.numerics, run.kv_type, run.device)
    _check_sampling_flags(temperature)
    if temperature > 0 and seed is None:  # drawn here, so the last line says how to get the same text again
        seed = secrets.randbits(32)
    sampler = Sampler(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    f = open_gguf(resolve_model(model))
    check_runnable(f)
    shape = check_model(f)
    if ctx is None:
        ctx = min(DEFAULT_CTX, shape.n_ctx_train) if shape.n_ctx_train else DEFAULT_CTX
    check_training_context(f.path, shape, ctx)
    check_context(f.path, shape, ctx, 2 if run.kv_type == "f16" else 4)
    engine = OurEngine(f, backend=run.backend, numerics=run.numerics, n_ctx=ctx, n_threads=run.threads,
                       kv_type=run.kv_type, device=run.device)
    run = dataclasses.replace(run, device=engine.backend.device)  # what it runs on, for the last line
    tokenizer = engine.tokenizer
    if chat:
        from inference_engine.chat import render_chat

        text = render_chat(engine.gguf, [{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = tokenizer.encode(text, add_bos=None, parse_special=True)
    else:
        ids = tokenizer.encode(prompt, add_bos=None, parse_special=True)
    if not ids:
        raise GGUFParityError("the prompt encodes to no tokens; give a non-empty PROMPT")
    engine.cache.check_room(len(ids))

    def show(piece: str) -> None:
        click.echo(piece, nl=False)
        sys.stdout.flush()

    result = run_generation(
        engine,
        ids,
        max_tokens,
        sampler=sampler,
        eog_ids=tokenizer.eog_ids,
        on_text=show,
        stream_decoder=tokenizer.stream_decoder(),
    )
    click.echo("")
    click.echo(f"{result.timings_line()} | {sampler.describe()} | {run.label()}", err=True)
