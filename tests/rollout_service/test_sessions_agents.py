"""Off-the-shelf agent frameworks through the session proxy, each driving a tool-using
episode against the scripted simulated engine: the OpenAI Agents SDK (`openai-agents`) with a
function tool, plainly and streamed, and LangChain's `ChatOpenAI` with a bound tool. Tracing
is off: the SDK would otherwise export spans to OpenAI (LangSmith traces only when asked)."""

from __future__ import annotations

import httpx
import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from tests.rollout_service.test_sessions_openai import CALL, FINAL, TOK, engine, trajectory  # noqa: F401 (fixture)
from wire import Trajectory

set_tracing_disabled(True)


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent_for(gateway) -> tuple[str, Agent]:
    created = httpx.post(f"{gateway.url}/v1/sessions", json={"metadata": {"agent": "openai-agents"}}).json()
    client = AsyncOpenAI(base_url=gateway.url + created["base_url_path"], api_key="unused", max_retries=0)
    return created["id"], Agent(name="adder", instructions="You add.", tools=[add],
                                model=OpenAIChatCompletionsModel(model="sim", openai_client=client))


def check_episode(gateway, sid: str) -> Trajectory:
    """Two turns appended in one sample: the call (exact ids), the tool's answer, the conclusion."""
    httpx.post(f"{gateway.url}/v1/sessions/{sid}/finish", json={"reward": 1.0})
    traj = Trajectory.model_validate(trajectory(gateway, sid))
    t0, t1 = traj.turns
    assert t0.output_ids == [*TOK.encode(CALL), TOK.eos_id] and t1.output_ids == [*TOK.encode(FINAL), TOK.eos_id]
    assert [t.segment for t in traj.turns] == [0, 0] and t0.tool_failure is None
    call_id = f"call_{sid[2:]}_0_0"
    assistant, answer = traj.messages[-3], traj.messages[-2]
    assert assistant.tool_calls[0].id == call_id and assistant.tool_calls[0].function.name == "add"
    assert answer.role == "tool" and answer.tool_call_id == call_id and answer.content == "5"
    assert "<|im_start|>tool\n5<|im_end|>" in TOK.decode(t1.prompt_ids)
    assert traj.loss_mask == [0] * len(t0.prompt_ids) + [1] * len(t0.output_ids) + \
        [0] * len(t1.prompt_ids) + [1] * len(t1.output_ids)
    assert traj.token_ids == [*t0.prompt_ids, *t0.output_ids, *t1.prompt_ids, *t1.output_ids]
    assert traj.reward == 1.0 and traj.usable
    return traj


@pytest.mark.asyncio
async def test_agents_sdk_runs_a_tool_episode_through_a_session(gateway, engine):  # noqa: F811
    sid, agent = agent_for(gateway)
    result = await Runner.run(agent, "What is 2 + 3?")
    assert result.final_output == FINAL
    traj = check_episode(gateway, sid)
    first_prompt = TOK.decode(traj.turns[0].prompt_ids)
    assert "You add." in first_prompt and '"name": "add"' in first_prompt


@pytest.mark.asyncio
async def test_agents_sdk_streamed_records_the_same_trajectory(gateway, engine):  # noqa: F811
    plain_sid, agent = agent_for(gateway)
    await Runner.run(agent, "What is 2 + 3?")
    sid, agent = agent_for(gateway)
    run = Runner.run_streamed(agent, "What is 2 + 3?")
    kinds = [event.type async for event in run.stream_events()]
    assert run.final_output == FINAL and "raw_response_event" in kinds
    streamed, plain = check_episode(gateway, sid), check_episode(gateway, plain_sid)
    for a, b in zip(streamed.turns, plain.turns, strict=True):
        assert (a.prompt_ids, a.output_ids) == (b.prompt_ids, b.output_ids)


def test_langchain_tool_loop_through_a_session(gateway, engine):  # noqa: F811
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    created = httpx.post(f"{gateway.url}/v1/sessions", json={"metadata": {"agent": "langchain"}}).json()
    llm = ChatOpenAI(model="sim", base_url=gateway.url + created["base_url_path"], api_key="unused",
                     max_retries=0).bind_tools([add])
    messages = [SystemMessage("You add."), HumanMessage("What is 2 + 3?")]
    reply = llm.invoke(messages)
    assert [c["name"] for c in reply.tool_calls] == ["add"] and reply.tool_calls[0]["args"] == {"a": 2, "b": 3}
    messages += [reply, *(add.invoke(call) for call in reply.tool_calls)]  # ToolMessages, ids kept
    streamed = None
    for chunk in llm.stream(messages):  # the closing turn streamed, as LangChain agents do
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.content == FINAL
    check_episode(gateway, created["id"])
