"""An S3-compatible server for the result-store tests: moto's, run on loopback (the `test` extra)."""

from __future__ import annotations

import pytest

from tests.conftest import free_port


@pytest.fixture(scope="module")
def s3_endpoint():
    """A real S3-compatible server on loopback: moto's, from PyPI (the `test` extra)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    yield f"http://127.0.0.1:{server._port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch, prefix):
    """A bucket of this test's own on the moto server, reached as a deployment would: AWS_* variables."""
    import boto3

    for name, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    bucket = "results-" + prefix.split(":")[1]
    boto3.client("s3").create_bucket(Bucket=bucket)
    return bucket


def s3_keys(bucket: str) -> list[str]:
    import boto3

    return [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
