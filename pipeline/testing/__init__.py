"""Scaffolding for tests, benchmarks and examples - never on a job's data path.

* ``seaweedfs``: a real S3 server (SeaweedFS ``weed mini``) on 127.0.0.1.
* ``tiny_models``: small random-initialised checkpoints of the real architectures.
* ``cut_videos``: generated videos with known cut points, and the detectors' precision/recall.
"""
