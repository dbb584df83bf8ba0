"""A real S3-compatible server for the tests: moto's server mode, started on 127.0.0.1 in its own process."""
import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from rollout_relabel.transforms.lib.io import filesystem

BUCKET = "relabel"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def moto_s3():
    """Yields s3://BUCKET on a moto server of its own; boto3 (Beam's S3 filesystem) and deltalake are
    pointed at it through the environment for as long as it runs."""
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    filesystem.use_options(PipelineOptions([]))  # Beam's S3 filesystem: boto3, which reads the environment
    try:
        deadline = time.time() + 60
        while True:
            try:
                boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                if time.time() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        yield f"s3://{BUCKET}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
