"""Request bodies of the OpenAI API as far as this server implements them (pydantic, unknown fields refused).

Fields OpenAI defines that we do not implement are accepted only at their neutral value (``n: 1``,
``presence_penalty: 0``, ...), so a client that sends defaults works and one that asks for more gets a 400 that
names the field. ``top_k`` (vLLM's extension; 0 or -1 = off) and llama.cpp's ``repeat_penalty`` (1 only) and
``min_p`` (0 only) are accepted because benchmark clients send them to llama.cpp's server and to ours alike.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_LOGPROBS = 20  # top alternatives per token (OpenAI: 5 for completions, 20 for chat)
MAX_STOPS = 16
# OpenAI accepts up to 300 logit_bias entries; a benchmark suppressing every end-of-generation token needs a few.
MAX_LOGIT_BIAS = 300
SEED_MODULUS = 2**64  # numpy's generator takes non-negative seeds; any integer a client sends maps into range


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: Literal[1] = 1
    presence_penalty: Literal[0] = 0
    frequency_penalty: Literal[0] = 0
    logit_bias: dict[str, float] | None = None
    repeat_penalty: Literal[1] = 1
    min_p: Literal[0] = 0

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings are supported")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        """OpenAI's shape: token id (as a string) -> a bias in [-100, 100] added to that token's logit."""
        if not v:
            return None
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} logit_bias entries are supported")
        out = {}
        for key, bias in v.items():
            if not str(key).isdigit():
                raise ValueError(f"logit_bias keys are token ids (0 or more), got '{key}'")
            if not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
                raise ValueError(f"logit_bias values must be between -100 and 100, got {bias} for token {key}")
            out[str(int(key))] = float(bias)
        return out

    @property
    def stop_list(self) -> list[str]:
        return list(self.stop or [])

    @property
    def sampling_seed(self) -> int | None:
        return None if self.seed is None else self.seed % SEED_MODULUS

    @property
    def top_k_or_off(self) -> int:
        return max(self.top_k, 0)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False
    best_of: Literal[1] | None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("one prompt per request is supported (a list of one string or one id list)")
            v = v[0]
        if isinstance(v, list) and not v:
            raise ValueError("the prompt is empty")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template_message(self) -> dict[str, Any]:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content}


class ChatCompletionRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
