"""Property-based fuzzing of the gateway over its own OpenAPI schema (schemathesis):
no 5xx, and every response conforms to the documented schema. Bounded examples."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings as hsettings

from rollout_service.app import create_app
from tests.conftest import LiveServer

_server: LiveServer | None = None


@pytest.fixture(scope="module")
def live(request):
    from rollout_service.config import Settings
    from tests.conftest import REDIS_URL

    settings = Settings(redis_url=REDIS_URL, key_prefix="rsfuzz:", sse_block_ms=100)
    with LiveServer(create_app(settings)) as srv:
        yield srv
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    keys = list(r.scan_iter(match="rsfuzz:*", count=1000))
    if keys:
        r.delete(*keys)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module")
def api_schema(live):
    return schemathesis.openapi.from_url(f"{live.url}/openapi.json")


@schema.parametrize()
@hsettings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_gateway_never_5xx_and_matches_its_schema(case):
    case.call_and_validate()
