"""Trajectory reads over real HTTP in both forms: JSON by default, the compact form by Accept,
zstd on the wire only where Accept-Encoding admits it, and a clear 4xx for an Accept we cannot meet."""

from __future__ import annotations

import httpx
import msgpack
import numpy as np
import pytest

from rollout_service.routes.formats import JSON, negotiate
from tests.conftest import RunningWorker
from trainer_client import RolloutClient
from trainer_client._client import unzstd
from wire import Trajectory, TrajectoryPage
from wire.errors import ApiError
from wire.packed import MEDIA_TYPE, unpack, unpack_page, unpack_trajectory

BATCH = {"tasks": [{"question": "What is 6 times 7?", "answer": 42}, {"seed": 4}], "env": "calc", "group_size": 3,
         "sampling": {"max_tokens": 48}}
PLAIN = {"Accept-Encoding": "identity"}  # httpx would otherwise ask for (and undo) zstd itself


def finished_batch(gateway, settings) -> str:
    with RolloutClient(gateway.url) as c, RunningWorker(settings):
        bid = c.submit(**BATCH).id
        c.wait(bid, poll_s=0.05, timeout=60)
    return bid


def float32(t: Trajectory) -> Trajectory:
    """What the compact form holds: logprobs at float32."""
    return t.model_copy(update={"turns": [x.model_copy(update={"output_logprobs": np.float32(
        x.output_logprobs).tolist()}) for x in t.turns]})


def test_json_by_default_and_compact_by_accept_carry_the_same_trajectories(gateway, settings):
    bid = finished_batch(gateway, settings)
    with httpx.Client(base_url=gateway.url) as c:
        url = f"/v1/batches/{bid}/trajectories"
        as_json = c.get(url, params={"limit": 4})
        assert as_json.headers["content-type"] == JSON
        page = TrajectoryPage.model_validate(as_json.json())
        compact = c.get(url, params={"limit": 4}, headers={"Accept": MEDIA_TYPE, **PLAIN})
        assert compact.status_code == 200 and compact.headers["content-type"] == MEDIA_TYPE
        assert "content-encoding" not in compact.headers
        items, nxt = unpack_page(compact.content)
        assert nxt == page.next_cursor == 4 and len(items) == 4
        assert [unpack(p) for p in items] == [float32(t) for t in page.items]
        assert all(t.turns and t.turns[0].output_ids for t in page.items)  # something was compared
        one = c.get(f"/v1/trajectories/{bid}-1-2", headers={"Accept": MEDIA_TYPE, **PLAIN})
        assert unpack(unpack_trajectory(one.content)) == float32(Trajectory.model_validate(
            c.get(f"/v1/trajectories/{bid}-1-2").json()))


def test_zstd_only_where_accept_encoding_admits_it(gateway, settings):
    bid = finished_batch(gateway, settings)
    url, compact = f"/v1/batches/{bid}/trajectories", {"Accept": MEDIA_TYPE}
    with httpx.Client(base_url=gateway.url) as c:
        plain = c.get(url, headers={**compact, **PLAIN})
        assert "content-encoding" not in plain.headers
        with c.stream("GET", url, headers={**compact, "Accept-Encoding": "zstd"}) as r:
            assert r.headers["content-encoding"] == "zstd"
            body = b"".join(r.iter_raw())  # the bytes as sent
        assert c.get(url, headers={**compact, "Accept-Encoding": "zstd"}).content == plain.content  # httpx undoes it
    assert len(body) < len(plain.content)
    assert unzstd(body) == plain.content  # several frames back to back: opened in turn, they are the plain page


def test_samples_in_the_compact_form(gateway, settings):
    bid = finished_batch(gateway, settings)
    with httpx.Client(base_url=gateway.url) as c:
        j = Trajectory.model_validate(c.get(f"/v1/trajectories/{bid}-0-0", params={"samples": True}).json())
        p = unpack_trajectory(c.get(f"/v1/trajectories/{bid}-0-0", params={"samples": True},
                                    headers={"Accept": MEDIA_TYPE}).content)
        assert p.training_samples is not None and unpack(p).training_samples == float32(j).with_samples().training_samples
        page = msgpack.unpackb(c.get(f"/v1/batches/{bid}/trajectories", params={"samples": True},
                                     headers={"Accept": MEDIA_TYPE}).content)
        assert all(t["training_samples"] for t in page["items"])


@pytest.mark.parametrize("accept", ["text/csv", "application/xml, text/html", "application/msgpack;q=0",
                                    "application/json;q=0, application/msgpack;q=0"])
def test_an_accept_we_cannot_meet_is_406_naming_what_we_serve(gateway, accept):
    with httpx.Client(base_url=gateway.url) as c:
        bid = c.post("/v1/batches", json=BATCH).json()["id"]
        for url in (f"/v1/batches/{bid}/trajectories", f"/v1/trajectories/{bid}-0-0"):
            r = c.get(url, headers={"Accept": accept})
            assert r.status_code == 406 and r.headers["content-type"] == JSON
            err = r.json()["error"]
            assert err["code"] == "not_acceptable" and err["details"]["supported"] == [JSON, MEDIA_TYPE]


@pytest.mark.parametrize("accept", ["application/msgpack;q=abc", "application/json;q=2"])
def test_a_malformed_q_is_400(gateway, accept):
    with httpx.Client(base_url=gateway.url) as c:
        bid = c.post("/v1/batches", json=BATCH).json()["id"]
        r = c.get(f"/v1/trajectories/{bid}-0-0", headers={"Accept": accept})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("accept, want", [
    (None, JSON), ("", JSON), ("*/*", JSON), ("application/*", JSON), ("application/json", JSON),
    ("text/html,application/xhtml+xml,*/*;q=0.8", JSON),  # a browser
    (MEDIA_TYPE, MEDIA_TYPE), ("application/x-msgpack", MEDIA_TYPE), ("application/vnd.msgpack", MEDIA_TYPE),
    (f"{MEDIA_TYPE}, */*", MEDIA_TYPE), (f"*/*, {MEDIA_TYPE}", MEDIA_TYPE), (f"{MEDIA_TYPE};q=0.4, {JSON}", JSON),
    (f"{MEDIA_TYPE}, {JSON};q=0.5", MEDIA_TYPE), ("APPLICATION/MSGPACK", MEDIA_TYPE),
])
def test_negotiation(accept, want):
    assert negotiate(accept) == want


def test_negotiation_refuses_what_it_cannot_serve():
    with pytest.raises(ApiError) as e:
        negotiate("image/png")
    assert e.value.status == 406
