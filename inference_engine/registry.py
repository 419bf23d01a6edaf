"""Renamed: the named-model download cache is :mod:`inference_engine.model_cache`. This re-export keeps branches
written before the rename importing ``resolve_model`` from here; new code imports ``inference_engine.model_cache``."""

from inference_engine.model_cache import *  # noqa: F401,F403
from inference_engine.model_cache import DEFAULT_MODEL, resolve_model  # noqa: F401
