"""The model as the server holds it: what the API (:mod:`~inference_engine.server.app`) and the response shapes
(:mod:`~inference_engine.server.responses`) need from it."""

from __future__ import annotations

from dataclasses import dataclass

from inference_engine.server.scheduler import Scheduler


@dataclass
class ServedModel:
    """What the API needs from the loaded model."""

    model_id: str  # the name clients send as "model"
    aliases: frozenset[str]
    scheduler: Scheduler
    tokenizer: object
    gguf: object
    n_ctx: int
    created: int
