"""Serves a `SimEngine` over the slice of vLLM's OpenAI-compatible API that we use
(`POST /v1/completions` with token-id prompts, `return_token_ids`, logprobs, per-request
timing `metrics`, and `stream` token by token as sampled; `/health`;
`/metrics`, the admin routes of a weight update: `/pause`, `/resume`,
`/collective_rpc` reload_weights, `/v1/load_lora_adapter`, `/reset_prefix_cache`, and
`POST /v1/chat/completions` rendered with the byte tokenizer, what a judge asks), so
`rollout up` without a GPU exercises the same HTTP path as a real vLLM. New "weights"
reseed the simulated policy, so outputs change after an update as they would for real."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, Field

from rollout_service.engines.base import GenerateRequest, GenerateResult
from rollout_service.engines.sim import CostModel, SimEngine
from rollout_service.tokens import chat_tokens
from rollout_service.turns import reply_text
from wire import ChatCompletionRequest, SamplingParams


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: list[int] = Field(min_length=1)
    max_tokens: int = Field(16, ge=1)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    logprobs: int | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    stop: list[str] | None = None
    skip_special_tokens: bool = True
    request_id: str | None = None
    kv_transfer_params: dict | None = None
    stream: bool = False
    stream_options: dict | None = None


def _bad_request(message: str) -> JSONResponse:
    """vLLM's answer to a request it refuses."""
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}},
                        status_code=400)


def create_app(engine: SimEngine, model: str = "sim", max_model_len: int = 131_072) -> FastAPI:
    """`max_model_len`: the context, refused and clamped as vLLM does (a `max_tokens` beyond it is
    refused; one the prompt leaves no room for is cut to what is left; a prompt that fills it is refused)."""
    app = FastAPI(title="simulated engine (vLLM-compatible subset)")
    stats = {"requests": 0, "generation_tokens": 0, "prompt_tokens": 0, "external_kv_tokens": 0}
    running = asyncio.Event()
    running.set()

    def reseed(source: str) -> None:
        engine.seed = int.from_bytes(hashlib.sha256(source.encode()).digest()[:4], "little")

    @app.post("/pause")
    async def pause(mode: str = "keep") -> dict:
        running.clear()
        return {}

    @app.post("/resume")
    async def resume() -> dict:
        running.set()
        return {}

    @app.post("/collective_rpc")
    async def collective_rpc(body: dict) -> dict:
        if body.get("method") != "reload_weights":
            raise HTTPException(400, f"unsupported method {body.get('method')!r}")
        reseed(str(body.get("kwargs", {}).get("weights_path")))
        return {"results": [None]}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(body: dict) -> str:
        reseed(f"lora:{body.get('lora_name')}:{body.get('lora_path')}")
        return "ok"

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict:
        return {}

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.get("/server_info")
    async def server_info() -> dict:
        # the slice of vLLM's dev-mode route that role detection reads: the simulated engine
        # hands KV over and takes it (its prefill/generate honour kv_transfer_params)
        return {"vllm_config": {"kv_transfer_config": {"kv_connector": "SimulatedConnector", "kv_role": "kv_both"}}}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "max_model_len": max_model_len}]}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> dict | JSONResponse:
        if "" in (body.stop or []):
            return _bad_request("stop cannot contain an empty string.")
        if body.max_tokens > max_model_len:
            return _bad_request(f"max_tokens={body.max_tokens} cannot be greater than max_model_len={max_model_len}.")
        max_tokens = min(body.max_tokens, max_model_len - len(body.prompt))
        if max_tokens < 1:
            return _bad_request(f"max_tokens must be at least 1, got {max_tokens}.")
        sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                  max_tokens=min(max_tokens, 32_768), seed=body.seed, stop=(body.stop or [])[:16])
        rid = body.request_id or uuid.uuid4().hex
        await running.wait()  # paused for a weight update: requests wait, as vLLM's mode=keep
        req = GenerateRequest(body.prompt, sampling, rid, kv_transfer_params=body.kv_transfer_params,
                              top_logprobs=min(body.logprobs or 0, 20))
        if (body.kv_transfer_params or {}).get("do_remote_decode"):
            params = await engine.prefill(req)
            stats["prompt_tokens"] += len(body.prompt)
            return {"id": f"cmpl-{rid}", "object": "text_completion", "model": body.model or model,
                    "choices": [{"index": 0, "text": "", "token_ids": [] if body.return_token_ids else None,
                                 "logprobs": {"token_logprobs": []}, "finish_reason": "length"}],
                    "kv_transfer_params": params}
        if (body.kv_transfer_params or {}).get("remote_num_tokens"):
            stats["external_kv_tokens"] += int(body.kv_transfer_params["remote_num_tokens"])
        if body.stream:
            return StreamingResponse(_stream(body, req), media_type="text/event-stream")
        res = await engine.generate(req)
        count(body, res)
        return {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "model": body.model or model,
            "choices": [{
                "index": 0,
                "text": reply_text(engine.tok, res.output_ids, sampling.stop),
                "token_ids": res.output_ids if body.return_token_ids else None,
                "prompt_token_ids": body.prompt if body.return_token_ids else None,
                "logprobs": logprobs(body, res.logprobs, res.top_logprobs),
                "finish_reason": res.finish_reason,
            }],
            "usage": usage(body, res),
            "metrics": timing(res),
        }

    def count(body: CompletionRequest, res: GenerateResult) -> None:
        stats["requests"] += 1
        stats["generation_tokens"] += len(res.output_ids)
        stats["prompt_tokens"] += len(body.prompt)

    def usage(body: CompletionRequest, res: GenerateResult) -> dict:
        return {"prompt_tokens": len(body.prompt), "completion_tokens": len(res.output_ids),
                "total_tokens": len(body.prompt) + len(res.output_ids)}

    def timing(res: GenerateResult) -> dict:
        # as vLLM with --enable-per-request-metrics: the cost model's prefill and decode
        return {"time_to_first_token_ms": res.prefill_s * 1000, "generation_time_ms": res.decode_s * 1000}

    def logprobs(body: CompletionRequest, lps: list[float], top: list | None) -> dict | None:
        if body.logprobs is None:
            return None
        return {"token_logprobs": lps,
                "top_logprobs": [{(f"token_id:{i}" if body.return_tokens_as_token_ids
                                   else engine.tok.decode([i])): lp for i, lp in alts} for alts in top or []] or None}

    async def _stream(body: CompletionRequest, req: GenerateRequest) -> AsyncIterator[str]:
        """vLLM's streamed completion: a chunk per sampled token (its text, ids and logprobs;
        the prompt ids on the first), the finish on the last, then, with
        `stream_options.include_usage`, a chunk with no choices carrying usage and timing."""
        head = {"id": f"cmpl-{req.request_id}", "object": "text_completion", "model": body.model or model}
        ids: list[int] = []
        said = ""
        async for ev in engine.stream(req):
            if isinstance(ev, GenerateResult):
                count(body, ev)
                yield _sse({**head, "choices": [{"index": 0, "text": "", "token_ids": [] if body.return_token_ids
                                                 else None, "finish_reason": ev.finish_reason}]})
                if (body.stream_options or {}).get("include_usage"):
                    yield _sse({**head, "choices": [], "usage": usage(body, ev), "metrics": timing(ev)})
                break
            text = reply_text(engine.tok, ids := ids + ev.ids, req.sampling.stop)
            yield _sse({**head, "choices": [{
                "index": 0, "text": text[len(said):], "finish_reason": None,
                "token_ids": ev.ids if body.return_token_ids else None,
                "prompt_token_ids": body.prompt if body.return_token_ids and len(ids) == len(ev.ids) else None,
                "logprobs": logprobs(body, ev.logprobs, ev.top_logprobs)}]})
            said = text
        yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> dict:
        prompt = chat_tokens(engine.tok).prompt([m.to_message() for m in body.messages])
        sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, max_tokens=body.limit,
                                  seed=body.seed, stop=body.stop_list())
        await running.wait()
        res = await engine.generate(GenerateRequest(prompt, sampling, uuid.uuid4().hex, [engine.tok.eos_id]))
        stats["requests"] += 1
        stats["generation_tokens"] += len(res.output_ids)
        stats["prompt_tokens"] += len(prompt)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "model": body.model or model,
                "choices": [{"index": 0, "logprobs": None,
                             "message": {"role": "assistant",
                                         "content": reply_text(engine.tok, res.output_ids, sampling.stop)},
                             "finish_reason": res.finish_reason}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(res.output_ids),
                          "total_tokens": len(prompt) + len(res.output_ids)}}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return (f"vllm:num_requests_running {engine._running}\n"
                f"vllm:generation_tokens_total {stats['generation_tokens']}\n"
                f"vllm:prompt_tokens_total {stats['prompt_tokens']}\n"
                f'vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} {stats["external_kv_tokens"]}\n'
                f"process_start_time_seconds {engine.created_at}\n")  # as prometheus_client writes it for vLLM

    return app


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def serve(host: str, port: int, seed: int, time_scale: float, model: str = "sim") -> None:
    import uvicorn

    engine = SimEngine(id=f"sim-{port}", seed=seed, cost=CostModel(), time_scale=time_scale)
    uvicorn.run(create_app(engine, model), host=host, port=port, log_level="warning")
