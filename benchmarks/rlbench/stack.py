"""The grading service: a rollout service of the grader's own, with a judge no submission touches.

    redis           embedded (data in STATE/redis), unless a URL is given
    policy engine   simulated, or vLLM serving the base model      registry prefix P
    judge engine    judge tasks only: a simulated judge, vLLM       registry prefix P + "judge:"
                    serving the base model, or a URL given
    env worker      `rollout env-worker --judge-url JUDGE/v1`: its `judge` env asks that engine
                    (the policy engine would be the very model graded); the judge engine is
                    also listed under P + "judge:", so the grader can show which one judges
    rollout up      --engine-url POLICY --env-workers 0: a rollout worker and the gateway, under P

Loading a submission (`POST /v1/weights` on this gateway) reloads every engine under P, which
is the policy engine alone: the agent's own service and the judge keep their weights. Each
part's output goes to STATE/logs/. Non-goal: restarting parts that die (`rollout up`
restarts its own; a dead engine or env worker shows up as failed evaluations, 503).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]  # the repository: `python -m benchmarks.rlbench` runs from here


@dataclass(slots=True)
class StackConfig:
    engine: str  # "sim" or "vllm"
    base_model: Path
    logs: Path
    prefix: str  # Redis key prefix of this grading service
    judge: bool = False  # start (or register) a judge engine
    redis_url: str | None = None
    redis_dir: Path | None = None  # the embedded Redis's data folder
    judge_url: str | None = None  # an external, fixed judge engine instead of our own
    judge_model: str = "judge"
    judge_tokenizer: str = "byte"

    @property
    def judge_prefix(self) -> str:
        return self.prefix + "judge:"


class GradingStack:
    """`with GradingStack(cfg) as url:` the gateway URL of a private rollout service."""

    def __init__(self, cfg: StackConfig, say=print) -> None:
        from rollout_service.up import Supervisor

        self.cfg = cfg
        self.sup = Supervisor(say=say)
        self.url = ""

    def __enter__(self) -> str:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        from rollout_service.up import Child, free_port, redis_server_binary, self_cmd, wait_redis

        cfg = self.cfg
        cfg.logs.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("ROLLOUT_ADMIN_KEY", "ROLLOUT_AUTH", "ROLLOUT_URL")}
        # Private and loopback-only: no auth (only the grader calls it), our Redis and prefix.
        env.update({"ROLLOUT_HOST": "127.0.0.1", "ROLLOUT_KEY_PREFIX": cfg.prefix,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))})
        redis_url = cfg.redis_url
        if not redis_url:
            port = free_port()
            data = cfg.redis_dir or cfg.logs.parent / "redis"
            data.mkdir(parents=True, exist_ok=True)
            redis_url = f"redis://127.0.0.1:{port}/0"
            self.sup.add(Child("redis (embedded)", [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                                                    "--dir", str(data), "--appendonly", "no", "--save", ""],
                               env, log=cfg.logs / "redis.log"))
            wait_redis(redis_url, 10)
        env["ROLLOUT_REDIS_URL"] = redis_url

        policy_url, model, tokenizer = self._engine("policy", env)
        judge: list[str] = []
        if cfg.judge:
            judge_url, jmodel, jtok = (cfg.judge_url, cfg.judge_model, cfg.judge_tokenizer) if cfg.judge_url \
                else self._engine("judge", env)
            register_engine(redis_url, cfg.judge_prefix, "judge", judge_url, jmodel, jtok)
            judge = ["--judge-url", f"{judge_url}/v1", "--judge-model", jmodel]

        wport = free_port()
        self.sup.add(Child("env worker (fixed judge)", self_cmd("env-worker", "--port", str(wport),
                                                                "--id", f"rlbench-env-{wport}", *judge),
                           env, f"http://127.0.0.1:{wport}/healthz", log=cfg.logs / "env-worker.log"))
        gport = free_port()
        self.url = f"http://127.0.0.1:{gport}"
        self.sup.add(Child("rollout service", self_cmd("up", "--port", str(gport), "--redis-url", redis_url,
                                                       "--engine-url", policy_url, "--model", model,
                                                       "--tokenizer", tokenizer, "--env-workers", "0"),
                           env, f"{self.url}/healthz", log=cfg.logs / "rollout-up.log"), timeout=120)
        _wait_for_workers(self.url, 30)
        return self.url

    def _engine(self, role: str, env: dict[str, str]) -> tuple[str, str, str]:
        """Start an engine on the base model: (url, served model name, tokenizer spec)."""
        from rollout_service.up import Child, free_port, self_cmd

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if self.cfg.engine == "sim":
            argv = self_cmd("sim-engine", "--port", str(port), "--time-scale", "0") if role == "policy" else \
                [sys.executable, "-m", "benchmarks.rlbench", "sim-judge", "--port", str(port)]
            self.sup.add(Child(f"{role} engine (simulated)", argv, env, f"{url}/health",
                               log=self.cfg.logs / f"{role}-engine.log"))
            return url, role, "byte"
        from rollout_service.local import vllm_local

        argv, venv = vllm_local.serve_command(self.cfg.base_model, port, role)
        self.sup.add(Child(f"{role} engine (vLLM, base model)", argv, {**env, **venv}, f"{url}/health",
                           log=self.cfg.logs / f"{role}-engine.log"), timeout=300)
        return url, role, str(self.cfg.base_model)

    def stop(self) -> None:
        self.sup.stop_all()


def register_engine(redis_url: str, prefix: str, eid: str, url: str, model: str, tokenizer: str) -> None:
    import redis

    from scheduler.keys import Keys
    from wire import EngineInfo

    info = EngineInfo(id=eid, url=url, model=model, tokenizer=tokenizer)
    redis.Redis.from_url(redis_url).hset(Keys(prefix).engines, eid, info.model_dump_json())


def _wait_for_workers(url: str, timeout: float) -> None:
    """The gateway answers before the env worker's first heartbeat may have landed."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/workers", timeout=2.0).json():
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"no env worker registered with {url} after {timeout:g} s")


# ---- the two processes of the stack that the `rollout` command has no entry point for ----

_RESPONSE = re.compile(r"RESPONSE:\n(.*?)\n\nGrade it now", re.DOTALL)


def toy_verdict(prompt_text: str, rng) -> str:
    """The simulated judge: deterministic, 1 point per distinct word of the response, up to 10."""
    m = _RESPONSE.search(prompt_text)
    words = set(m.group(1).lower().split()) if m else set()
    return f"A toy verdict for tests and dry runs.\nscore: {min(len(words), 10)}"


def serve_sim_judge(port: int) -> None:
    import uvicorn

    from rollout_service.engines.sim import SimEngine
    from rollout_service.engines.sim_server import create_app

    uvicorn.run(create_app(SimEngine(id="sim-judge", policy=toy_verdict), model="judge"), host="127.0.0.1",
                port=port, log_level="warning")
