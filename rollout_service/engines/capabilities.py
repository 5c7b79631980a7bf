"""Which prefill/decode roles an engine can serve, read from its KV connector configuration.

A role is only a routing decision when an engine can both hand its KV to another engine and
take KV from one: vLLM calls that `kv_role: kv_both`. Upstream is deprecating `kv_both`, so
the service no longer assumes it: every engine is asked (`VLLMEngine.capabilities`, from
vLLM's `/server_info`, a dev-mode route `rollout engine serve` turns on) and what it answers
maps to roles here:

    kv_both (or producer and consumer)   prefill, decode, mixed
    kv_producer                          prefill, mixed      (hands KV over, never takes it)
    kv_consumer                          decode, mixed       (takes KV, never hands it over)
    no connector, or a role not known    mixed               (said so in `kv`)
    nothing to ask (no /server_info)     None                (unknown: kept out of allocation)

The verdict, in words, goes to the registry (`can_serve`, `kv`) and shows in `rollout engines`;
the allocator moves only engines that can serve every role, and the gateway refuses a role an
engine cannot serve.

Non-goals: starting engines with a connector (`rollout_service.local.vllm_local`), routing.
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = ("prefill", "decode", "mixed")
_BY_KV_ROLE = {
    "kv_both": ALL,
    "kv_producer": ("prefill", "mixed"),
    "kv_consumer": ("decode", "mixed"),
}


@dataclass(slots=True, frozen=True)
class Capabilities:
    can_serve: tuple[str, ...] | None  # None: could not tell
    kv: str  # what was found, in words
    reads_back: bool = False  # a decode engine keeps a turn's KV for the next prefill (no recompute)

    @property
    def switchable(self) -> bool:
        return self.can_serve is not None and set(ALL) <= set(self.can_serve)


def from_kv_config(cfg: dict | None) -> Capabilities:
    """Roles from a vLLM `kv_transfer_config` (as `/server_info?config_format=json` gives it)."""
    if not cfg or not cfg.get("kv_connector"):
        return Capabilities(("mixed",), "no KV connector: colocated (mixed) only")
    name, role = str(cfg["kv_connector"]), cfg.get("kv_role")
    extra = cfg.get("kv_connector_extra_config") or {}
    roles = _BY_KV_ROLE.get(str(role))
    if roles is None:
        # a newer vLLM may name roles differently: say what it was, take only what is safe
        return Capabilities(("mixed",), f"{name} with kv_role {role!r}, not understood: mixed only")
    reads_back = bool(extra.get("bidirectional_kv_xfer")) and roles == ALL
    return Capabilities(roles, f"{name} {role}" + (", response KV read back" if reads_back else ""), reads_back)


def unknown(why: str) -> Capabilities:
    return Capabilities(None, f"unknown: {why}")
