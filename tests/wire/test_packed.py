"""The compact trajectory form: what it packs, what it refuses, and that it reads back as JSON did."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from pydantic_core import PydanticSerializationError

from trainer_client.tensors import as_numpy, as_torch
from wire import Trajectory, TrajectoryPage, TrajectoryState, Turn
from wire.base import FunctionCall, Message, ToolCall
from wire.batches import Failure, FailureKind
from wire.packed import (
    PackedTrajectory,
    pack_floats,
    pack_ints,
    pack_trajectory,
    pack_turn,
    page_bytes,
    unpack,
    unpack_page,
    unpack_trajectory,
    unpack_turn,
    with_samples,
)


def turn(i: int, prompt: list[int], out: list[int], lps: list[float], segment: int = 0) -> Turn:
    return Turn(index=i, prompt_ids=prompt, output_ids=out, output_logprobs=lps, finish_reason="stop",
                policy_version=3, engine_id="e0", segment=segment)


def traj(turns: list[Turn]) -> Trajectory:
    return Trajectory(id="b-0-1", batch_id="b", group_index=0, sample_index=1, env="math", task={"q": "2+2?"},
                      state=TrajectoryState.completed, reward=0.5, turns=turns, info={"k": [1, "x"]})


F32 = [-0.5, -0.25, -3.0]  # exact in float32: the round trip must be exact


def test_round_trip_is_exact_for_float32_logprobs_and_int32_ids():
    t = traj([turn(0, [1, 2, 151_000], [2**31 - 1, 0], F32[:2]), turn(1, [9], [8], F32[2:])])
    raw = pack_trajectory(t)
    assert unpack(unpack_trajectory(raw)) == t
    doc = msgpack.unpackb(raw)
    assert doc["turns"][0]["prompt_ids"] == struct.pack("<3i", 1, 2, 151_000)  # little-endian int32, as documented
    assert doc["turns"][0]["output_logprobs"] == struct.pack("<2f", -0.5, -0.25)
    assert set(doc) == set(Trajectory.model_fields)  # the JSON form's keys, no more, no fewer


def test_every_field_but_the_token_arrays_is_what_the_json_form_has():
    # packed from the models' fields directly, not through model_dump: nested models, enums and
    # free-form values must come out as the JSON form has them
    t = traj([turn(0, [1], [2], [-1.0]), turn(1, [3], [4], [-2.0], segment=1)]).model_copy(update={
        "state": TrajectoryState.failed, "failure": Failure(kind=FailureKind.env, message="boom"),
        "messages": [Message(role="assistant", content="hi", tool_calls=[
            ToolCall(id="c1", function=FunctionCall(name="f", arguments="{}"))]),
            Message(role="tool", content="ok", tool_call_id="c1")],
        "task": {"q": (1, 2), "n": None}, "info": {"nested": {"t": (3.5, "x")}, "raw": b"ab"}, "attempts": 2, "active_s": 1.25})
    t.turns[0].timings.prefill_s, t.turns[1].tool_failure = 0.125, "timeout"
    def fields(turn: dict) -> dict:  # a turn's document without its token arrays
        return {k: v for k, v in turn.items() if k not in {"prompt_ids", "output_ids", "output_logprobs"}}

    doc, want = msgpack.unpackb(pack_trajectory(t, samples=False)), t.model_dump(mode="json")
    assert [fields(x) for x in doc.pop("turns")] == [fields(x) for x in want.pop("turns")]
    assert doc == want
    assert fields(msgpack.unpackb(pack_turn(t.turns[1]))) == fields(t.turns[1].model_dump(mode="json"))


def test_integers_beyond_64_bits_round_trip_exactly_as_an_extension_type():
    """msgpack's integers stop at 64 bits; a task's answer of 2**100 or a 128-bit hash in `info`
    made the result unstorable. They travel as extension type BIG_INT (decimal digits), which our
    readers turn back into the integer and any msgpack reader can still read past."""
    from wire.packed import BIG_INT

    big = {"answer": 2**100, "neg": -(2**64), "edge": [2**64 - 1, -(2**63)], "small": 7}
    t = traj([turn(0, [1], [2], [-1.0])]).model_copy(update={"task": big, "info": {"hash": 2**127 + 1}})
    raw = pack_trajectory(t)
    assert unpack(unpack_trajectory(raw)) == t
    assert unpack(unpack_trajectory(with_samples(raw))).task == big
    plain_reader = msgpack.unpackb(raw)  # no hook: the value is there, as an extension
    assert plain_reader["task"]["answer"] == msgpack.ExtType(BIG_INT, str(2**100).encode())
    assert plain_reader["task"]["edge"] == [2**64 - 1, -(2**63)] and plain_reader["task"]["small"] == 7


def test_a_float64_logprob_is_rounded_to_float32():
    t = traj([turn(0, [1], [2], [-0.1])])
    got = unpack(unpack_trajectory(pack_trajectory(t))).turns[0].output_logprobs[0]
    assert got == float(np.float32(-0.1)) and got != -0.1


def test_a_token_id_outside_int32_is_refused():
    with pytest.raises(OverflowError):
        pack_trajectory(traj([turn(0, [2**31], [1], [-1.0])]))


def test_a_logprob_beyond_float32_packs_as_infinity_and_any_iterable_packs():
    """Where `struct` refuses a value, the packed bytes are `array`'s: ±inf for a float32 overflow."""
    t = traj([turn(0, [1], [2, 3, 4], [-1e39, float("-inf"), -0.5])])
    assert unpack(unpack_trajectory(pack_trajectory(t))).turns[0].output_logprobs == [float("-inf")] * 2 + [-0.5]
    assert pack_floats([1e39]) == np.array([np.inf], "<f4").tobytes()
    assert pack_ints(range(3)) == pack_ints((0, 1, 2)) == np.arange(3, dtype="<i4").tobytes()


def test_arrays_of_more_lengths_than_the_compiled_formats_kept_still_pack_exactly(monkeypatch):
    """Formats are compiled once per length and kept up to a bound, then dropped together."""
    import wire.packed as packed

    monkeypatch.setattr(packed, "STRUCTS_CACHED", 8)
    monkeypatch.setitem(packed._structs, "i", {})
    for n in [*range(30), 3, 29, 1000]:  # more lengths than kept, and lengths seen before
        ids = [(7919 * k) % 2**31 - 2**30 for k in range(n)]
        assert pack_ints(ids) == np.array(ids, "<i4").tobytes()
        assert len(packed._structs["i"]) <= 8
    assert pack_ints([]) == b""


def test_a_result_that_fails_to_pack_leaves_the_next_one_packed_whole():
    """Packing reuses one msgpack Packer per thread: one that raised halfway must not leave its
    bytes in front of the next result's."""
    good = traj([turn(0, [1, 2], [3], [-0.5])])
    want = pack_trajectory(good)
    bad = traj([turn(0, [1, 2], [3], [-0.5])])
    bad.messages = [Message(role="user", content="x")]
    bad.messages[0].content = object()  # not encodable: fails inside msgpack, after the keys before it
    with pytest.raises(PydanticSerializationError):  # (msgpack's hook hands it to pydantic, which refuses)
        pack_trajectory(bad)
    assert pack_trajectory(good) == want and unpack(unpack_trajectory(want)) == good
    assert unpack_turn(pack_turn(good.turns[0])) == good.turns[0]


def test_packed_samples_match_the_json_forms_samples_segment_by_segment():
    t = traj([turn(0, [1, 2], [3, 4], [-0.5, -0.25]), turn(1, [5], [6], [-3.0]),
              turn(2, [7, 8, 9], [10], [-0.5], segment=1)])
    packed = unpack_trajectory(pack_trajectory(t)).samples()
    assert len(packed) == len(t.samples()) == 2
    for p, s in zip(packed, t.samples()):
        ids, mask, lps = as_numpy(p)
        assert ids.tolist() == s.token_ids and mask.tolist() == s.loss_mask and lps.tolist() == s.logprobs
        tids, tmask, tlps = as_torch(p)
        assert tids.tolist() == s.token_ids and tmask.tolist() == s.loss_mask and tlps.tolist() == s.logprobs


def test_with_samples_adds_the_training_view_packed():
    t = traj([turn(0, [1, 2], [3], [-0.5])])
    p = unpack_trajectory(with_samples(pack_trajectory(t)))
    assert p.training_samples is not None and unpack(p).training_samples == t.samples()


def test_a_page_of_stored_bytes_decodes_as_a_trajectory_page():
    items = [traj([turn(0, [i], [i + 1], [-0.5])]).model_copy(update={"id": f"b-0-{i}"}) for i in range(20)]
    for n in (0, 1, 15, 16, 20):  # msgpack's fixarray ends at 15: both headers
        got, nxt = unpack_page(page_bytes([pack_trajectory(t) for t in items[:n]], 40 if n else None))
        assert [unpack(p) for p in got] == items[:n] and nxt == (40 if n else None)
    raw = msgpack.unpackb(page_bytes([], None))
    assert set(raw) == set(TrajectoryPage.model_fields)


def test_live_turns_round_trip_at_four_bytes_a_token_and_a_logprob():
    t = turn(4, list(range(100_000, 100_500)), list(range(50_000, 50_500)), [float(np.float32(-i / 7)) for i in range(500)])
    raw = pack_turn(t)
    assert unpack_turn(raw) == t
    fields = len(pack_turn(t.model_copy(update={"prompt_ids": [], "output_ids": [], "output_logprobs": []})))
    assert len(raw) == fields + 4 * 1000 + 4 * 500 + 3  # each bin header: 2 bytes when empty, 3 past 255 bytes
    assert len(raw) * 2 < len(t.model_dump_json())


def test_an_unknown_field_in_the_compact_form_is_an_error():
    doc = msgpack.unpackb(pack_trajectory(traj([])))
    doc["surprise"] = 1
    with pytest.raises(ValueError):
        PackedTrajectory.model_validate(doc)
