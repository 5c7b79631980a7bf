"""Adapter for vLLM's OpenAI-compatible server (and anything serving the same shape).

We send token ids as the prompt of `POST /v1/completions` with `return_token_ids` and
`logprobs`, and keep the sampled ids and their logprobs exactly as returned. Prefill time (to
the first token) comes from the response's per-request `metrics`, when the server has them on
(streamed: on the closing usage chunk). `stream` reads the same request as server-sent chunks,
handing on each chunk's ids and logprobs as vLLM samples them. The engine
echoes the prompt ids it actually used; if they differ from what we sent, the turn fails
(a silent drift would corrupt the training sample).

New weights (`update_weights`) go through vLLM's admin routes: `/pause` (in-flight requests
freeze, `mode=keep`), `reload_weights` through `/collective_rpc` or a LoRA adapter loaded in
place (`/v1/load_lora_adapter`), `/reset_prefix_cache` (stale KV would mix policies), then
`/resume`; frozen requests finish on the new weights.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from rollout_service.engines.base import (ContextFull, EngineError, EngineLost, GenerateRequest, GenerateResult,
                                          TokenDelta, refused)
from rollout_service.engines.capabilities import Capabilities, from_kv_config, unknown
from wire import EngineInfo


RESUME_TRIES = 4  # asks for `/resume` after a weight update, 0.2 s apart, doubling
_START = re.compile(r"^process_start_time_seconds ([0-9.e+]+)$", re.M)


def _top_logprobs(raw, k: int, n: int, engine_id: str) -> list[list[tuple[int, float]]] | None:
    """vLLM's per-token {"token_id:N": logprob} (the sampled token and the k best) as the k
    best (id, logprob), best first."""
    if not k:
        return None
    try:
        out = [sorted(((int(t.removeprefix("token_id:")), float(lp)) for t, lp in (d or {}).items()),
                      key=lambda p: -p[1])[:k] for d in raw]
    except (TypeError, ValueError, AttributeError) as e:
        raise EngineError(f"engine {engine_id} gave malformed top_logprobs: {e!r}") from e
    if len(out) != n:
        raise EngineError(f"engine {engine_id} returned {n} ids but {len(out)} top_logprobs")
    return out


def split_timing(metrics: dict | None, elapsed_s: float) -> tuple[float, float]:
    """(prefill, decode) seconds of one request. vLLM started with `--enable-per-request-metrics`
    (as `rollout up` and `engine serve` start it) answers with the time from scheduling to the
    first token (prefill) and from there to the last (decode); its own queue wait and the HTTP
    round trip are left to the caller's queue time. Without them all of it counts as decode."""
    try:
        ttft_ms, gen_ms = (metrics or {}).get("time_to_first_token_ms"), (metrics or {}).get("generation_time_ms")
        if ttft_ms is None:
            return 0.0, elapsed_s
        prefill = max(float(ttft_ms) / 1000, 0.0)
        decode = max(float(gen_ms) / 1000, 0.0) if gen_ms is not None else max(elapsed_s - prefill, 0.0)
        return prefill, decode
    except (TypeError, ValueError, AttributeError):  # a malformed block costs the split, never the turn
        return 0.0, elapsed_s


class VLLMEngine:
    def __init__(self, id: str, url: str, model: str = "default", policy_version: int = 0,
                 client: httpx.AsyncClient | None = None, timeout_s: float = 600.0):
        self.id = id
        self.url = url.rstrip("/")
        self.model = model
        self.policy_version = policy_version
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))
        self._owns_client = client is None
        self._context: int | None | bool = False  # the engine's max_model_len; False: not known yet

    @classmethod
    def from_info(cls, info: EngineInfo) -> VLLMEngine:
        return cls(info.id, info.url, info.model, info.policy_version)

    def payload(self, req: GenerateRequest) -> dict:
        s = req.sampling
        body = {
            "model": self.model,
            "prompt": req.prompt_ids,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "logprobs": max(1, req.top_logprobs),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,  # top_logprobs keyed "token_id:N": ids, not text
            "skip_special_tokens": False,
            "request_id": req.request_id,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = s.stop
        if req.stop_token_ids:
            body["stop_token_ids"] = req.stop_token_ids
        if req.kv_transfer_params is not None:
            body["kv_transfer_params"] = req.kv_transfer_params
        return body

    async def prefill(self, req: GenerateRequest) -> dict:
        """Prefill only, keeping the KV for a decode engine; returns its kv_transfer_params.
        `req.kv_transfer_params`, when set, are what the decode engine of the trajectory's last
        turn returned: with them the engine reads that turn's KV back instead of recomputing it."""
        params = {**(req.kv_transfer_params or {}), "do_remote_decode": True}
        one = dataclasses.replace(req, sampling=req.sampling.model_copy(update={"max_tokens": 1}),
                                  kv_transfer_params=params, request_id=f"{req.request_id}-p")
        params = (await self._complete(one)).get("kv_transfer_params")
        if not params:
            raise EngineError(f"engine {self.id} returned no kv_transfer_params: is it serving with a KV connector?")
        return params

    async def context_limit(self) -> int | None:
        """The engine's context in tokens (`max_model_len` in vLLM's `/v1/models`), asked once;
        None where the server does not say."""
        if self._context is False:
            try:
                r = await self._client.get(f"{self.url}/v1/models", timeout=5.0)
            except Exception:  # unreachable now (the call that follows says so): ask next time
                return None
            try:
                models = [m for m in r.json()["data"] if isinstance(m, dict)] if r.status_code == 200 else []
            except Exception:  # not that API
                models = []
            found = [m for m in models if m.get("id") == self.model] or models[:1]
            limit = found[0].get("max_model_len") if found else None
            self._context = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
        return self._context

    def forget_context(self) -> None:
        """Ask the context again before the next request (the engine came back: maybe restarted)."""
        self._context = False

    async def _fit(self, req: GenerateRequest) -> GenerateRequest:
        """`req` with `max_tokens` no more than the engine's context leaves after the prompt (vLLM
        refuses a `max_tokens` beyond its context, whatever the prompt); ContextFull if nothing is
        left. A trajectory's turns grow its prompt until it fills the context: that ends it, truncated."""
        limit = self._context if self._context is not False else await self.context_limit()  # (asked once)
        if limit is None:
            return req
        room = limit - len(req.prompt_ids)
        if room < 1:
            raise ContextFull(f"engine {self.id}: the prompt's {len(req.prompt_ids)} tokens leave no room in its "
                              f"context of {limit} (max_model_len)")
        if req.sampling.max_tokens <= room:
            return req
        return dataclasses.replace(req, sampling=req.sampling.model_copy(update={"max_tokens": room}))

    async def _complete(self, req: GenerateRequest) -> dict:
        req = await self._fit(req)
        try:
            r = await self._client.post(f"{self.url}/v1/completions", json=self.payload(req))
        except httpx.HTTPError as e:
            raise EngineLost(f"engine {self.id} unreachable: {e!r}") from e
        if r.status_code != 200:
            raise refused(self.id, r.status_code, r.text)
        try:
            return r.json()
        except ValueError as e:
            raise EngineError(f"engine {self.id} answered with no JSON: {e!r}") from e

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        t0 = time.perf_counter()
        version = self.policy_version  # the version serving when the request was sent
        body = await self._complete(req)
        try:
            choice = body["choices"][0]
            ids = [int(i) for i in choice["token_ids"]]
            lps = [float(x) if x is not None else 0.0 for x in choice["logprobs"]["token_logprobs"]]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise EngineError(f"engine {self.id} gave a malformed completion: {e!r}") from e
        if len(lps) != len(ids):
            raise EngineError(f"engine {self.id} returned {len(ids)} ids but {len(lps)} logprobs")
        top = _top_logprobs(choice["logprobs"].get("top_logprobs"), req.top_logprobs, len(ids), self.id)
        seen = choice.get("prompt_token_ids")
        if seen is not None and list(seen) != req.prompt_ids:
            raise EngineError(f"engine {self.id} saw a different prompt than sent ({len(seen)} vs "
                              f"{len(req.prompt_ids)} ids)")
        prefill_s, decode_s = split_timing(body.get("metrics"), time.perf_counter() - t0)
        return GenerateResult(ids, lps, choice.get("finish_reason") or "stop", version, self.id, prefill_s, decode_s,
                              kv_transfer_params=body.get("kv_transfer_params"), top_logprobs=top)

    async def stream(self, req: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        """`generate` as vLLM streams it: each chunk's sampled ids and logprobs as they come
        (its text is left: the caller decodes the ids), then the whole result. Closing the
        iterator early closes the connection, and vLLM aborts the request."""
        t0 = time.perf_counter()
        version = self.policy_version
        req = await self._fit(req)
        body = {**self.payload(req), "stream": True, "stream_options": {"include_usage": True}}
        ids: list[int] = []
        lps: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        finish, metrics = None, None
        try:
            async with self._client.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    raise refused(self.id, r.status_code, (await r.aread()).decode(errors="replace"))
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or (data := line[5:].strip()) == "[DONE]":
                        continue
                    chunk = self._chunk(data)
                    metrics = chunk.get("metrics") or metrics
                    for choice in chunk.get("choices") or []:
                        seen = choice.get("prompt_token_ids")  # on the first chunk: checked before a token is handed on
                        if seen is not None and list(seen) != req.prompt_ids:
                            raise EngineError(f"engine {self.id} saw a different prompt than sent ({len(seen)} vs "
                                              f"{len(req.prompt_ids)} ids)")
                        finish = choice.get("finish_reason") or finish
                        delta = self._delta(choice, req.top_logprobs)
                        if delta.ids:
                            ids += delta.ids
                            lps += delta.logprobs
                            tops += delta.top_logprobs or []
                            yield delta
        except httpx.HTTPError as e:
            raise EngineLost(f"engine {self.id} unreachable: {e!r}") from e
        if finish is None:
            raise EngineError(f"engine {self.id} ended its stream without a finish_reason")
        prefill_s, decode_s = split_timing(metrics, time.perf_counter() - t0)
        yield GenerateResult(ids, lps, finish, version, self.id, prefill_s, decode_s,
                             top_logprobs=tops if req.top_logprobs else None)

    def _chunk(self, data: str) -> dict:
        try:
            chunk = json.loads(data)
        except ValueError as e:
            raise EngineError(f"engine {self.id} streamed a chunk that is not JSON: {e!r}") from e
        if not isinstance(chunk, dict):
            raise EngineError(f"engine {self.id} streamed a chunk that is not an object")
        if "error" in chunk:  # vLLM reports a failure mid-stream as a chunk of its own
            raise EngineError(f"engine {self.id} failed mid-stream: {str(chunk['error'])[:300]}")
        return chunk

    def _delta(self, choice: dict, top_k: int) -> TokenDelta:
        try:
            ids = [int(i) for i in choice.get("token_ids") or []]
            block = choice.get("logprobs") or {}
            lps = [float(x) if x is not None else 0.0 for x in block.get("token_logprobs") or []]
        except (TypeError, ValueError, AttributeError) as e:
            raise EngineError(f"engine {self.id} streamed a malformed chunk: {e!r}") from e
        if len(lps) != len(ids):
            raise EngineError(f"engine {self.id} streamed {len(ids)} ids but {len(lps)} logprobs")
        return TokenDelta(ids, lps, _top_logprobs(block.get("top_logprobs") or [], top_k, len(ids), self.id))

    async def _admin(self, path: str, **kw) -> None:
        try:
            r = await self._client.post(f"{self.url}{path}", **kw)
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise EngineLost(f"engine {self.id} unreachable: {e!r}") from e
        if r.status_code >= 400:
            raise EngineError(f"{self.url}{path} answered {r.status_code}: {r.text[:300]}")

    async def update_weights(self, path: str, lora_name: str | None, loaded: Callable[[], Awaitable[None]]) -> None:
        """Load new weights from `path` (a checkpoint folder, or the LoRA adapter `lora_name`).
        `loaded` runs once they are in, while requests are still frozen (the caller records
        the new policy version there, so no turn finishing on them carries the old one). The
        engine is resumed whatever happens; a failure raises `EngineError`."""
        await self._admin("/pause", params={"mode": "keep"})
        try:
            if lora_name is None:
                await self._admin("/collective_rpc",
                                  json={"method": "reload_weights", "kwargs": {"weights_path": path}})
            else:
                await self._admin("/v1/load_lora_adapter",
                                  json={"lora_name": lora_name, "lora_path": path, "load_inplace": True})
            await self._admin("/reset_prefix_cache")
            await loaded()
        except BaseException:
            await self._resume()  # (the failure that got here is the one reported)
            raise
        resumed = await self._resume()
        if resumed is not None:
            raise EngineError(f"new weights loaded, but the engine stays paused: {resumed}")

    async def _resume(self) -> str | None:
        """Resume a paused engine, asking up to RESUME_TRIES times (vLLM's server closes the
        connection of a request that failed with a 500, and the next request on it, the resume,
        failed as "server disconnected": the engine stayed paused, every request frozen for good).
        None when resumed, else why not."""
        why = None
        for attempt in range(RESUME_TRIES):
            try:
                await self._admin("/resume")
                return None
            except EngineError as e:
                why = str(e)
                if attempt + 1 < RESUME_TRIES:
                    await asyncio.sleep(0.2 * 2 ** attempt)
        return why

    async def capabilities(self) -> Capabilities:
        """The roles this engine can serve, from its KV connector configuration (vLLM's dev-mode
        `/server_info`). An engine that cannot say is `unknown`, never assumed to switch."""
        try:
            r = await self._client.get(f"{self.url}/server_info", params={"config_format": "json"}, timeout=10.0)
        except httpx.HTTPError as e:
            raise EngineLost(f"engine {self.id} unreachable: {e!r}") from e
        if r.status_code != 200:
            return unknown(f"/server_info answered {r.status_code} (vLLM without VLLM_SERVER_DEV_MODE=1?)")
        try:
            cfg = r.json()["vllm_config"]
            return from_kv_config(cfg.get("kv_transfer_config") if isinstance(cfg, dict) else None)
        except (ValueError, KeyError, TypeError, AttributeError):
            return unknown("/server_info gave no vllm_config")

    async def started_at(self) -> float | None:
        """From `/metrics`: the process's `process_start_time_seconds` (prometheus_client's own,
        which vLLM's server exports). None if it cannot be read; EngineLost if unreachable."""
        try:
            r = await self._client.get(f"{self.url}/metrics", timeout=5.0)
        except httpx.HTTPError as e:
            raise EngineLost(f"engine {self.id} unreachable: {e!r}") from e
        if r.status_code != 200:
            return None
        found = _START.search(r.text)
        try:
            return float(found.group(1)) if found else None
        except ValueError:
            return None

    async def health(self) -> bool:
        try:
            return (await self._client.get(f"{self.url}/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
