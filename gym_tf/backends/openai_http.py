"""Any OpenAI-compatible server (vllm serve, llama.cpp, SGLang, hosted APIs) through the official async client.

Retries with exponential backoff on connection errors, 408, 409, 429 and 5xx are the `openai` client's own
(`max_retries`); this module adds the group fallback for servers that ignore `n` and turns failures into
gym-tf errors that name the URL, the model and what the server said.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai

from gym_tf.backends.base import Choice, Generation, Messages, Sampling, gather_or_cancel, split_tokens
from gym_tf.backends.limits import ConcurrencyLimit
from gym_tf.errors import BackendRequestFailed, BackendUnreachable, ModelNotFound


# Tokenizers average 3 to 5 characters a token on text; a group's usage that leaves many more to each token counted
# cannot have counted the whole group (llama.cpp's leaves the group's n times the first choice's share).
MAX_CHARS_PER_TOKEN = 8


class OpenAIBackend:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
        adaptive: bool = False,
    ):
        self.base_url = base_url
        self.model = model or ""
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=max_retries,
            # `transport` is the test seam (httpx.MockTransport); None keeps the client's own.
            http_client=httpx.AsyncClient(transport=transport, timeout=timeout_s) if transport else None,
        )
        self.slots = ConcurrencyLimit(concurrency, adaptive=adaptive)
        self.supports_n: bool | None = None  # learned from the first group request
        # Whether the usage of an n > 1 reply counts every choice. llama.cpp's llama-server (whose default is 4
        # slots) counts the first choice alone: learned when a reply's usage is below what its choices must have
        # used; from then on each choice is counted off its per-token log-probabilities, unless the server refuses
        # to send them (`logprobs_refused`: the usage is then shared out, as before).
        self.counts_each_choice: bool | None = None
        self.logprobs_refused = False
        # How to ask for schema-constrained JSON, learned by trying: OpenAI/vLLM/llama.cpp's llama-server take
        # `json_schema`; llama-cpp-python's server only `json_object` with a `schema`; others neither.
        self.schema_modes: list[str] = ["json_schema", "json_object"]

    def describe(self) -> str:
        return f"openai-compatible {self.base_url} model={self.model}"

    async def check(self) -> None:
        """Fail early, and clearly, if the server is down or does not serve the model. Picks the model if unset."""
        try:
            served = [m.id async for m in self.client.models.list()]
        except openai.APIConnectionError as exc:
            raise BackendUnreachable(f"cannot reach {self.base_url}: {exc.__cause__ or exc}") from None
        except openai.APIStatusError as exc:
            raise BackendRequestFailed(f"{self.base_url} answered {exc.status_code} to /models: {exc.message}") from None
        if not self.model:
            if not served:
                raise ModelNotFound(f"{self.base_url} serves no model")
            self.model = served[0]
        elif served and self.model not in served:
            raise ModelNotFound(f"{self.base_url} does not serve model {self.model!r}; it serves {served}")

    async def generate(self, messages: Messages, n: int = 1, **sampling: Any) -> Generation:
        params = Sampling(**sampling)
        start = time.perf_counter()
        if n > 1 and self.supports_n is False:
            parts = await gather_or_cancel(*(self._request(messages, 1, params, i) for i in range(n)))
        else:
            try:
                parts = [await self._request(messages, n, params, 0)]
            except BackendRequestFailed as exc:
                # llama.cpp's llama-server answers 400 to n > 1 in chat completions: ask for the group one by one.
                if n == 1 or "'n'" not in str(exc):
                    raise
                parts = []
            if n > 1:
                self.supports_n = bool(parts) and len(parts[0].choices) >= n
                have = len(parts[0].choices) if parts else 0
                parts += await gather_or_cancel(*(self._request(messages, 1, params, i) for i in range(have, n)))
        choices = [c for part in parts for c in part.choices][:n]
        return Generation(
            choices=choices,
            prompt_tokens=sum(p.prompt_tokens for p in parts),
            completion_tokens=sum(p.completion_tokens for p in parts),
            latency_s=time.perf_counter() - start,
        )

    async def _request(self, messages: Messages, n: int, params: Sampling, offset: int) -> Generation:
        kwargs: dict[str, Any] = dict(
            model=self.model,
            messages=messages,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
        )
        if n > 1:
            kwargs["n"] = n
            if self.counts_each_choice is False and not self.logprobs_refused:
                kwargs.update(logprobs=True, top_logprobs=1)
        if params.seed is not None:
            # A different seed per single request, so a server without `n` still gives G different samples.
            kwargs["seed"] = params.seed + offset
        if params.stop:
            kwargs["stop"] = list(params.stop)
        # The mode this request tries, fixed now: concurrent requests may learn of a refusal while this one is out.
        mode = self.schema_modes[0] if params.json_schema is not None and self.schema_modes else None
        if mode == "json_schema":
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "reply", "schema": params.json_schema}}
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object", "schema": params.json_schema}
        async with self.slots:
            start = time.perf_counter()
            try:
                reply = await self.client.chat.completions.create(**kwargs)
            except openai.APITimeoutError:
                self.slots.overloaded()
                raise BackendUnreachable(f"{self.base_url} timed out (model {self.model!r})") from None
            except openai.APIStatusError as exc:
                if exc.status_code == 429:
                    self.slots.overloaded()
                if kwargs.get("logprobs") and exc.status_code == 400 and "logprobs" in str(exc.message):
                    self.logprobs_refused = True  # ask again without: counted as before, not failed for good
                elif "response_format" not in kwargs or "response_format" not in str(exc.message):
                    raise self._failed(exc) from None
                elif mode in self.schema_modes:
                    # This server refuses this way of asking for JSON: try the next way, or none (the learner
                    # validates every reply anyway). Drop the refused mode, not the head of the list: another
                    # request refused the same way may have dropped it already.
                    self.schema_modes.remove(mode)
                refused = True
            except openai.APIConnectionError as exc:
                raise BackendUnreachable(
                    f"cannot reach {self.base_url} (model {self.model!r}): {exc.__cause__ or exc}"
                ) from None
            except ValueError as exc:  # a 200 whose body is not JSON (JSONDecodeError, UnicodeDecodeError)
                raise BackendRequestFailed(f"{self.base_url} (model {self.model!r}) answered with a body that is "
                                           f"not JSON: {exc}") from None
            else:
                refused = False
        if refused:
            return await self._request(messages, n, params, offset)
        generation = self._generation(reply, time.perf_counter() - start, params.max_tokens)
        self.slots.observe(generation.latency_s, generation.completion_tokens)
        return generation

    def _generation(self, reply: Any, latency_s: float, max_tokens: int | None = None) -> Generation:
        """The reply as a Generation. The client does not validate what a server sends (an HTML login page arrives
        as a str, a reply without choices as a ChatCompletion with `choices=None`): anything that is not a chat
        completion is a named failure, not an AttributeError (found by tests/test_attack_faults.py)."""
        try:
            usage = reply.usage
            completion_tokens = int(usage.completion_tokens) if usage else 0
            prompt_tokens = int(usage.prompt_tokens) if usage else 0
            ordered = sorted(reply.choices, key=lambda c: c.index)
            per_choice = self._per_choice(ordered, completion_tokens, max_tokens)
            choices = [Choice(text=_text(c.message.content), finish_reason=c.finish_reason, completion_tokens=t)
                       for c, t in zip(ordered, per_choice)]
            completion_tokens = max(completion_tokens, sum(per_choice))
        except (AttributeError, TypeError, ValueError):
            raise BackendRequestFailed(f"{self.base_url} (model {self.model!r}) answered with something that is not "
                                       f"a chat completion: {str(reply)[:200]!r}") from None
        return Generation(choices=choices, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          latency_s=latency_s)

    def _per_choice(self, ordered: list[Any], reported: int, max_tokens: int | None) -> list[int]:
        """Each choice's completion tokens: off its log-probabilities where the server sent them for every choice,
        else the usage shared out. A usage that counted only some choices is found out two ways: it is below what
        the choices must have used (each cut at `max_tokens` used that many, any other at least one), or it leaves
        more than `MAX_CHARS_PER_TOKEN` characters of the group's text to each token counted. Then those bounds are
        counted, and later requests ask for log-probabilities."""
        counted = [len(c.logprobs.content) if getattr(c, "logprobs", None) and c.logprobs.content is not None
                   else None for c in ordered]
        if len(ordered) > 1 and None not in counted:
            return counted
        shared = split_tokens(reported, max(1, len(ordered)))
        if len(ordered) < 2 or reported <= 0:  # one choice, or no usage at all: nothing to check it against
            return shared
        floor = [max_tokens if c.finish_reason == "length" and max_tokens else 1 for c in ordered]
        chars = sum(len(c.message.content or "") for c in ordered)
        if reported < sum(floor) or chars > MAX_CHARS_PER_TOKEN * reported:
            self.counts_each_choice = False
            return [max(f, t) for f, t in zip(floor, shared)]
        return shared

    def _failed(self, exc: openai.APIStatusError) -> Exception:
        if exc.status_code == 404:
            return ModelNotFound(f"{self.base_url}: model {self.model!r} not found ({exc.message})")
        return BackendRequestFailed(f"{self.base_url} answered {exc.status_code} for model {self.model!r}: {exc.message}",
                                    status=exc.status_code)

    async def aclose(self) -> None:
        await self.client.close()


def _text(content: Any) -> str:
    if content is None:
        return ""
    if not isinstance(content, str):
        raise TypeError("message content is not text")
    return content
