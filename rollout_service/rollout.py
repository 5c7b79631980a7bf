"""The multi-turn loop: one episode of one task, from opening messages to a Trajectory.

    render -> token ids -> engine (token-in/token-out) -> action text -> env.step
           -> observation tokens appended with loss mask 0 -> repeat

until the environment ends the episode (completed / truncated) or a limit hits
(max_turns, max_total_tokens: truncated). The sampled ids are kept exactly as sampled;
text is decoded from them only to hand the action to the environment.

Each turn that the episode goes on after is handed to `on_turn` as it finishes (its env step
done), so the worker can record it durably meanwhile. The last turn is not: it reaches the
store with the trajectory's result, one write instead of two (a rerun restarts from the first
turn anyway; the live turns are for readers).

Failures are data: an engine or env error ends the episode as `failed` with a kind, with
the turns done so far; the worker decides whether to retry it. Losing a peer process (an
engine or env worker unreachable, `EngineLost`/`EnvWorkerLost`) or Redis is not the
trajectory's failure: it propagates, and the worker restarts the episode from scratch.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable

from env_workers.client import EnvBackend, EnvRejected, EnvUnavailable, EnvWorkerLost
from env_workers.env import SandboxUnavailable
from rollout_service.engines.base import ContextFull, EngineError, EngineLost, EngineRejected, GenerateRequest
from rollout_service.engines.fleet import Fleet
from rollout_service.tokens import TemplateDriftError, chat_tokens
from rollout_service.turns import record_turn
from scheduler.lifecycle import Lifecycle
from scheduler.store import Work
from wire import Failure, FailureKind, Message, Trajectory, TrajectoryState, Turn

OnTurn = Callable[[Turn], Awaitable[None]]


def turn_seed(base: int | None, group_index: int, sample_index: int, turn: int) -> int | None:
    """Distinct, reproducible sampling seeds for each member of a group and each turn."""
    if base is None:
        return None
    h = hashlib.sha256(f"{base}:{group_index}:{sample_index}:{turn}".encode()).digest()
    return int.from_bytes(h[:4], "little")


def env_seed(sample_index: int) -> int:
    """The seed an episode's environment is reset with: its place in the group, so a replay
    (`rollout_service.replay`) resets it the same way."""
    return sample_index


async def run_episode(work: Work, fleet: Fleet, envs: EnvBackend, attempt: int = 1,
                      lifecycle: Lifecycle | None = None, restarts: int = 0,
                      on_turn: OnTurn | None = None) -> Trajectory:
    """`lifecycle`, when given, is told every phase change (prefill, tool, done) for the
    scheduler's forecaster; `on_turn`, every turn but the last once its env step is done. Seeds depend only
    on the task and turn, never on `attempt` or `restarts`: a restarted episode replays the
    same seeds."""
    p = work.params
    traj = Trajectory(id=work.trajectory_id, batch_id=work.batch_id, group_index=work.group_index,
                      sample_index=work.sample_index, env=p.env, task=work.task, state=TrajectoryState.running,
                      attempts=attempt, restarts=restarts)
    t0 = time.monotonic()
    lc = lifecycle if lifecycle is not None else Lifecycle()  # (an empty one is falsy)
    try:
        if p.deadline_s is not None:
            async with asyncio.timeout(p.deadline_s):
                await _loop(traj, work, fleet, envs, f"{attempt}.{restarts}", lc, on_turn)
        else:
            await _loop(traj, work, fleet, envs, f"{attempt}.{restarts}", lc, on_turn)
    except TimeoutError:
        traj.state, traj.failure = TrajectoryState.failed, Failure(
            kind=FailureKind.timeout, message=f"deadline of {p.deadline_s}s active time exceeded")
    except (EngineLost, EnvWorkerLost):
        raise  # not the trajectory's failure: the worker restarts the episode
    except ContextFull:  # the conversation fills the engine's context: it ends there
        traj.state = TrajectoryState.truncated
        traj.info["truncated_by"] = "context"
    except EngineRejected as e:  # the request, as the task and its parameters made it
        traj.state, traj.failure = TrajectoryState.failed, Failure(kind=FailureKind.rejected, message=str(e))
    except EngineError as e:
        traj.state, traj.failure = TrajectoryState.failed, Failure(kind=FailureKind.engine, message=str(e))
    except SandboxUnavailable as e:  # before EnvUnavailable, its base class
        traj.state, traj.failure = TrajectoryState.failed, Failure(kind=FailureKind.sandbox, message=str(e))
    except EnvUnavailable as e:
        traj.state, traj.failure = TrajectoryState.failed, Failure(kind=FailureKind.env, message=str(e))
    except EnvRejected as e:
        traj.state, traj.failure = TrajectoryState.failed, Failure(kind=FailureKind.rejected, message=str(e))
    except TemplateDriftError as e:
        traj.state, traj.failure = TrajectoryState.failed, Failure(kind=FailureKind.internal, message=str(e))
    finally:
        traj.active_s = time.monotonic() - t0
        fleet.forget(traj.id)
        if lc.get(traj.id) is not None:
            lc.on_done(traj.id)
    if traj.state is not TrajectoryState.failed:
        traj.reward = sum(t.reward for t in traj.turns)
    return traj


async def _loop(traj: Trajectory, work: Work, fleet: Fleet, envs: EnvBackend, attempt: str,
                lc: Lifecycle, on_turn: OnTurn | None) -> None:
    p = work.params
    handle, opening = await envs.open(p.env, work.task, seed=env_seed(work.sample_index), trajectory_id=traj.id)
    try:
        tok_spec, tok = await fleet.tokenizer_for(traj.id)
        chat = chat_tokens(tok)
        traj.messages = list(opening)
        context: list[int] = []
        delta = chat.prompt(opening)
        segment = 0
        lc.on_submit(traj.id, p.env, len(delta))
        for index in range(p.max_turns):
            room = p.max_total_tokens - len(context) - len(delta)
            if room <= 0:
                traj.state = TrajectoryState.truncated
                traj.info["truncated_by"] = "max_total_tokens"
                return
            sampling = p.sampling.model_copy(update={"max_tokens": min(p.sampling.max_tokens, room),
                                                     "seed": turn_seed(p.sampling.seed, work.group_index,
                                                                        work.sample_index, index)})
            req = GenerateRequest(context + delta, sampling, f"{traj.id}-{attempt}-{index}", [tok.eos_id])
            t_send = time.monotonic()
            lc.on_prefill(traj.id, len(delta))
            res = await fleet.generate(traj.id, tok_spec, req, len(delta))
            lc.on_tool(traj.id, len(res.output_ids))  # no first-token signal without streaming
            turn, action = record_turn(traj, delta, res, tok, segment, time.monotonic() - t_send)
            context += delta + res.output_ids
            traj.messages.append(Message(role="assistant", content=action))

            t_tool = time.monotonic()
            step = await envs.step(handle, action)
            turn.timings.tool_s = time.monotonic() - t_tool
            turn.reward = step.reward
            turn.tool_failure = step.info.get("tool_failure")
            traj.messages += step.observation
            if step.terminated or step.truncated:
                traj.state = TrajectoryState.completed if step.terminated else TrajectoryState.truncated
                if step.truncated:
                    traj.info["truncated_by"] = "env"
                return
            if on_turn is not None and index + 1 < p.max_turns:
                await on_turn(turn)
            if p.context == "append":
                delta = chat.continuation(res.output_ids, step.observation)
                continue
            full = chat.prompt(traj.messages)
            if full[: len(context)] == context:
                delta = full[len(context):]
            else:  # the template rewrote an earlier prefix: start a new training sample
                segment, context, delta = segment + 1, [], full
        traj.state = TrajectoryState.truncated
        traj.info["truncated_by"] = "max_turns"
    finally:
        await envs.close(handle)
