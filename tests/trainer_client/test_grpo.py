"""GRPO helpers: advantages per group, failure masking, packing, the clipped loss (CPU, fast)."""

from __future__ import annotations

import math

import pytest

from trainer_client.grpo import advantages, clipped_loss, pack, token_logprobs, within_staleness
from wire import Failure, FailureKind, Trajectory, TrajectoryState, Turn

torch = pytest.importorskip("torch")


def turn(index: int, prompt: list[int], out: list[int], version: int = 0, segment: int = 0) -> Turn:
    return Turn(index=index, prompt_ids=prompt, output_ids=out, output_logprobs=[-0.1 * (i + 1) for i in range(len(out))],
                finish_reason="stop", policy_version=version, engine_id="e0", segment=segment)


def traj(group: int, sample: int, reward: float | None, state: str = "completed", turns: list[Turn] | None = None,
         batch: str = "b") -> Trajectory:
    failure = Failure(kind=FailureKind.engine, message="boom") if state == "failed" else None
    return Trajectory(id=f"{batch}-{group}-{sample}", batch_id=batch, group_index=group, sample_index=sample, env="calc",
                      task={}, state=TrajectoryState(state), reward=reward, failure=failure,
                      turns=turns if turns is not None else [turn(0, [1, 2, 3], [4, 5])])


def test_advantages_are_normalized_within_each_group():
    ts = [traj(0, 0, 1.0), traj(0, 1, 0.0), traj(1, 0, 3.0), traj(1, 1, 1.0), traj(1, 2, 2.0)]
    a = advantages(ts)
    assert a[0] == pytest.approx(1.0, abs=1e-5) and a[1] == pytest.approx(-1.0, abs=1e-5)
    std = math.sqrt(2 / 3)
    assert a[2:] == pytest.approx([1 / std, -1 / std, 0.0], abs=1e-5)
    assert advantages(ts, scale=False)[2:] == pytest.approx([1.0, -1.0, 0.0])


def test_groups_with_equal_rewards_are_skipped():
    ts = [traj(0, 0, 1.0), traj(0, 1, 1.0), traj(1, 0, 0.0), traj(1, 1, 1.0)]
    assert advantages(ts)[:2] == [None, None]
    assert None not in advantages(ts)[2:]


def test_same_group_index_in_two_batches_is_two_groups():
    ts = [traj(0, 0, 1.0, batch="x"), traj(0, 1, 1.0, batch="x"), traj(0, 0, 0.0, batch="y"), traj(0, 1, 1.0, batch="y")]
    a = advantages(ts)
    assert a[:2] == [None, None] and None not in a[2:]


def test_failed_members_are_masked_not_counted_as_zero():
    ts = [traj(0, 0, 1.0), traj(0, 1, 0.0), traj(0, 2, None, state="failed"), traj(0, 3, 1.0)]
    a = advantages(ts)
    assert a[2] is None
    mean, std = 2 / 3, math.sqrt(2 / 9)  # over the three usable members only
    assert a[0] == pytest.approx((1 - mean) / std, abs=1e-5) and a[1] == pytest.approx(-mean / std, abs=1e-5)
    # one usable member left: no group statistics at all
    assert advantages([traj(0, 0, 1.0), traj(0, 1, None, state="failed")]) == [None, None]
    # a truncated trajectory is usable (the policy ran out of room); a cancelled one is not
    assert advantages([traj(0, 0, 1.0, state="truncated"), traj(0, 1, 0.0)])[0] is not None
    assert advantages([traj(0, 0, 1.0, state="cancelled"), traj(0, 1, 0.0)]) == [None, None]


def test_pack_aligns_tokens_masks_and_engine_logprobs():
    multi = [turn(0, [1, 2, 3], [4, 5]), turn(1, [6, 7], [8])]
    ts = [traj(0, 0, 1.0, turns=multi), traj(0, 1, 0.0), traj(0, 2, None, state="failed")]
    b = pack(ts, advantages(ts), pad_id=0)
    assert len(b) == 2 and b.trajectory_ids == ["b-0-0", "b-0-1"]
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 8, [1] * 5 + [0] * 3]
    assert b.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 0, 0, 0]]
    assert b.old_logprobs[0].tolist() == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.1])
    assert b.advantages.tolist() == pytest.approx([1.0, -1.0], abs=1e-5)
    assert b.tokens == 13
    cut = pack(ts, advantages(ts), pad_id=0, max_len=4)
    assert cut.input_ids.shape == (2, 4) and cut.loss_mask[0].tolist() == [0, 0, 0, 1]


def test_pack_gives_one_row_per_sample():
    split = [turn(0, [1, 2], [3]), turn(1, [1, 9], [4], segment=1)]
    ts = [traj(0, 0, 1.0, turns=split), traj(0, 1, 0.0)]
    b = pack(ts, advantages(ts), pad_id=0)
    assert b.trajectory_ids == ["b-0-0", "b-0-0", "b-0-1"]
    assert b.input_ids[:2, :3].tolist() == [[1, 2, 3], [1, 9, 4]]
    assert b.advantages[0] == b.advantages[1]


def test_pack_of_nothing_is_empty():
    b = pack([traj(0, 0, 1.0)], [None], pad_id=0)
    assert len(b) == 0 and b.input_ids.shape == (0, 0)
    with pytest.raises(ValueError):
        pack([traj(0, 0, 1.0)], [], pad_id=0)


def test_micro_batches_cover_every_row_once_and_trim_padding():
    ts = [traj(0, i, float(i % 2), turns=[turn(0, [1] * (2 + i), [5] * (1 + i))]) for i in range(6)]
    b = pack(ts, advantages(ts), pad_id=0)
    parts = b.micro_batches(max_tokens=16)
    assert sorted(t for p in parts for t in p.trajectory_ids) == sorted(b.trajectory_ids)
    for p in parts:
        assert p.input_ids.shape[1] == int(p.attention_mask.sum(1).max())
        assert len(p) == 1 or p.input_ids.numel() <= 16


def test_staleness_is_judged_per_turn():
    t = traj(0, 0, 1.0, turns=[turn(0, [1], [2], version=3), turn(1, [3], [4], version=5)])
    assert within_staleness(t, 5, 2) and within_staleness(t, 4, 1)
    assert not within_staleness(t, 5, 1)  # turn 0 is two versions old
    assert within_staleness(traj(0, 0, 1.0, turns=[]), 9, 0)


def test_token_logprobs_match_log_softmax():
    torch.manual_seed(0)
    logits, ids = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    lp = token_logprobs(logits, ids)
    assert lp.shape == (2, 5) and lp[:, 0].abs().sum() == 0
    ref = torch.log_softmax(logits, -1)[0, 2, ids[0, 3]]
    assert lp[0, 3] == pytest.approx(float(ref), abs=1e-5)
    assert token_logprobs(logits, ids, temperature=2.0)[0, 3] == pytest.approx(
        float(torch.log_softmax(logits / 2, -1)[0, 2, ids[0, 3]]), abs=1e-5)


def test_clipped_loss_is_the_policy_gradient_at_ratio_one():
    ts = [traj(0, 0, 1.0), traj(0, 1, 0.0)]
    b = pack(ts, advantages(ts), pad_id=0)
    new = b.old_logprobs.clone().requires_grad_(True)
    loss, stats = clipped_loss(new, b)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-5) and stats["kl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["tokens"] == 4 and stats["clip_frac"] == 0.0
    # d loss / d logp = -A / tokens on sampled tokens, 0 elsewhere
    assert new.grad[0].tolist() == pytest.approx([0, 0, 0, -0.25, -0.25], abs=1e-5)
    assert new.grad[1].tolist() == pytest.approx([0, 0, 0, 0.25, 0.25], abs=1e-5)


def test_clipped_loss_stops_the_gradient_beyond_the_clip():
    ts = [traj(0, 0, 1.0), traj(0, 1, 0.0)]
    b = pack(ts, advantages(ts), pad_id=0)
    new = (b.old_logprobs + 0.5 * b.loss_mask).requires_grad_(True)  # ratio e^0.5 > 1.2 everywhere sampled
    loss, stats = clipped_loss(new, b, clip=0.2)
    loss.backward()
    assert stats["clip_frac"] == 1.0 and stats["kl"] > 0
    assert new.grad[0].abs().sum() == 0  # positive advantage, ratio above 1 + clip: no push further
    assert new.grad[1].abs().sum() > 0  # negative advantage: still pushed down


def test_importing_the_client_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, trainer_client, trainer_client.grpo; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_module_example_runs():
    import doctest

    from trainer_client import grpo

    result = doctest.testmod(grpo)
    assert result.attempted > 0 and result.failed == 0
