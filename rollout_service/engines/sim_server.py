"""Serves a `SimEngine` over the slice of vLLM's OpenAI-compatible API that we use
(`POST /v1/completions` with token-id prompts, `return_token_ids`, logprobs, per-request
timing `metrics`; `/health`;
`/metrics`, the admin routes of a weight update: `/pause`, `/resume`,
`/collective_rpc` reload_weights, `/v1/load_lora_adapter`, `/reset_prefix_cache`, and
`POST /v1/chat/completions` rendered with the byte tokenizer, what a judge asks), so
`rollout up` without a GPU exercises the same HTTP path as a real vLLM. New "weights"
reseed the simulated policy, so outputs change after an update as they would for real."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from rollout_service.engines.base import GenerateRequest
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


def create_app(engine: SimEngine, model: str = "sim") -> FastAPI:
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
        return {"object": "list", "data": [{"id": model, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> dict:
        sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                  max_tokens=min(body.max_tokens, 32_768), seed=body.seed, stop=(body.stop or [])[:16])
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
        res = await engine.generate(req)
        stats["requests"] += 1
        stats["generation_tokens"] += len(res.output_ids)
        stats["prompt_tokens"] += len(body.prompt)
        return {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "model": body.model or model,
            "choices": [{
                "index": 0,
                "text": reply_text(engine.tok, res.output_ids, sampling.stop),
                "token_ids": res.output_ids if body.return_token_ids else None,
                "prompt_token_ids": body.prompt if body.return_token_ids else None,
                "logprobs": {"token_logprobs": res.logprobs,
                             "top_logprobs": [{(f"token_id:{i}" if body.return_tokens_as_token_ids
                                                else engine.tok.decode([i])): lp for i, lp in alts}
                                              for alts in res.top_logprobs or []] or None}
                if body.logprobs is not None else None,
                "finish_reason": res.finish_reason,
            }],
            "usage": {"prompt_tokens": len(body.prompt), "completion_tokens": len(res.output_ids),
                      "total_tokens": len(body.prompt) + len(res.output_ids)},
            # as vLLM with --enable-per-request-metrics: the cost model's prefill and decode
            "metrics": {"time_to_first_token_ms": res.prefill_s * 1000, "generation_time_ms": res.decode_s * 1000},
        }

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
                f'vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} {stats["external_kv_tokens"]}\n')

    return app


def serve(host: str, port: int, seed: int, time_scale: float, model: str = "sim") -> None:
    import uvicorn

    engine = SimEngine(id=f"sim-{port}", seed=seed, cost=CostModel(), time_scale=time_scale)
    uvicorn.run(create_app(engine, model), host=host, port=port, log_level="warning")
