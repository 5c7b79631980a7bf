"""`swe`: fix the planted bug in a real sandbox; reward = the restored tests pass."""

from __future__ import annotations

from env_workers.envs.swe import _BANK, SweEnv, generate
from env_workers.resources import Pools, PoolSize


def the_fix(repo) -> tuple[str, str, str]:
    """(path, buggy text, fixed text) of the planted bug."""
    for _src, _test, bugs in _BANK.values():
        for fn, (old, new), _ in bugs:
            if fn == repo["function"]:
                return repo["module"].replace(".", "/") + ".py", new, old
    raise AssertionError


def test_fixing_the_bug_scores_one_and_sandbox_comes_with_the_first_tool_call():
    pools = Pools(PoolSize(warm=0, cap=2))
    try:
        claims = pools.claims()
        env, repo = SweEnv(resources=claims), generate(4)
        env.reset({"seed": 4})
        assert claims.held == []
        r = env.step("```bash\npython3 -m unittest 2>&1 | tail -1\n```")
        assert "FAILED" in r.observation[0].content and len(claims.held) == 1
        path, bad, good = the_fix(repo)
        r = env.step(f"```replace {path}\n{bad}\n=======\n{good}\n```")
        assert "edited" in r.observation[0].content
        done = env.step("submit")
        assert done.terminated and done.reward == 1.0 and claims.held == []  # released at the end
    finally:
        pools.close()


def test_submit_without_tools_scores_zero_without_a_sandbox():
    env = SweEnv()
    env.reset({"seed": 2})
    r = env.step("submit")
    assert r.terminated and r.reward == 0.0


def test_deleting_the_tests_does_not_pass_them():
    env = SweEnv()
    env.reset({"seed": 5})
    env.step("```bash\nrm -rf tests\n```")
    assert env.step("submit").reward == 0.0


def test_a_hung_command_is_a_timeout_told_as_text():
    env = SweEnv(tool_timeout_s=0.5)
    env.reset({"seed": 1})
    r = env.step("```bash\nsleep 30\n```")
    assert r.info["tool_failure"] == "timeout" and "timed out" in r.observation[0].content
    assert env.step("```bash\necho alive\n```").observation[0].content.strip() == "alive"
    env.close()


def test_repository_is_generated_deterministically():
    assert generate(9) == generate(9) and generate(9) != generate(10)
