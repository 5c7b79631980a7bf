"""Engines and weights: registering an engine, changing its role, pushing new weights."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from wire.base import Input, Int, Version, Wire


# 1-65535, no leading zero: in the schema, so a client sees which ports it may send (five digits
# once reached 99999, and connecting raised OverflowError: a 500 on the next weight push)
PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"


class LoadedWeights(Input):
    """What the engine's last weight update loaded, and when the engine's process had started then:
    an engine that restarts comes back with the weights it was launched with, so one whose
    process started later no longer holds these (`rollout_service.weights.WeightKeeper` loads
    them again; until then no turn runs on it)."""

    path: str = Field(min_length=1, max_length=1024)
    lora_name: str | None = Field(None, max_length=256)
    engine_started_at: float | None = Field(None, description="The engine process's start time (Unix seconds) "
                                                              "when they were loaded; None: the engine does not say.")


class EngineInfo(Input):
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    url: str = Field(min_length=8, max_length=512, pattern=r"^https?://[A-Za-z0-9._\[\]-]+(:" + PORT + r")?(/[!-~]*)?$")
    model: str = Field("default", max_length=200)
    gpus: Int = Field(1, ge=1, le=4096, description="GPUs the engine runs on: its tensor parallelism (or its data-"
                                                   "parallel attention group). Launch planning compares sizes by it.")

    @field_validator("url")
    @classmethod
    def _parsable(cls, v: str) -> str:
        # Within the pattern above, the one URL httpx cannot use is a bracketed host (an IPv6
        # literal, which needs ':' and so never matches): refused here, so every URL that
        # passes is one the engine client can reach, without importing an HTTP library.
        host = v.split("://", 1)[1].split("/", 1)[0].split(":", 1)[0]
        if host.startswith("[") and "]" in host:
            raise ValueError(f"not a usable URL: invalid IPv6 host {host!r}")
        return v
    policy_version: Int = Field(0, ge=0)
    kind: str = Field("vllm", min_length=1, max_length=64, pattern=r"^[a-z0-9_]+$",
                      description="Which client speaks to it (`rollout_service.engines.kinds`); "
                                  "an engine of a kind a worker does not know is skipped.")
    tokenizer: str = Field("byte", max_length=512, description="'byte' or a local tokenizer folder.")
    tool_parser: str = Field("hermes", min_length=1, max_length=64, pattern=r"^[a-z0-9_]+$",
                             description="How the session proxy reads tool calls out of this model's text "
                                         "(`rollout_service.toolcalls.PARSERS`: hermes, mistral).")
    role: Literal["prefill", "decode", "mixed"] = Field(
        "mixed", description="Which half of a turn it serves (prefill/decode allocation).")
    state: Literal["ready", "draining"] = Field(
        "ready", description="draining: finishing what it holds before the allocator gives it a new role; it gets "
                             "no new work meanwhile.")
    next_role: Literal["prefill", "decode", "mixed"] | None = Field(
        None, description="While draining: the role it takes once it holds nothing (kept here, not only in the "
                          "allocator, so an allocator that restarts finishes the move).")
    can_serve: list[Literal["prefill", "decode", "mixed"]] | None = Field(
        None, description="The roles its KV connector allows, as detected from the engine (workers ask it; None: "
                          "not asked yet). Only an engine that can serve every role takes part in allocation.")
    kv: str | None = Field(None, max_length=300,
                           description="What detection found, in words (e.g. 'NixlConnector kv_both, response KV read "
                                       "back'); None: not asked yet.")
    kv_read_back: bool = Field(False, description="As a decode engine it keeps a turn's KV for the next turn's "
                                                  "prefill engine to read (no recompute of the response).")
    weights: LoadedWeights | None = Field(None, description="What the last weight update loaded (None: the weights "
                                                            "it was launched with).")


class EngineStatus(EngineInfo):
    """A registered engine as listed: its registration, and how the workers find it now."""

    up: bool = Field(True, description="False while a worker's probe finds it unreachable (an engine no "
                                       "worker has found down counts as up).")
    inflight_tokens: Int = Field(0, ge=0, description="Tokens in flight on it, summed over the workers.")


class EngineRoleUpdate(Input):
    role: Literal["prefill", "decode", "mixed"]


class WeightUpdate(Input):
    """Push new weights: a full checkpoint folder, or (with `lora_name`) a LoRA adapter folder."""

    path: str = Field(min_length=1, max_length=1024, description="Folder readable by the engines.")
    lora_name: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$",
                                  description="Load `path` as this LoRA adapter; requests then name it.")
    version: Version | None = Field(None, description="Default: highest current version + 1.")
    engines: list[str] | None = Field(None, description="Default: every registered engine.")


class EngineUpdateResult(Wire):
    engine_id: str
    ok: bool
    seconds: float
    error: str | None = None


class WeightUpdateResult(Wire):
    """Partial failure is data: `ok` is False if any engine failed (it keeps its old version)."""

    ok: bool
    version: int
    results: list[EngineUpdateResult]
