"""The tar dialect mmpipe's shard reader (``input.shards``) and writer
(``output.sinks.webdataset``) share: POSIX pax headers, UTF-8 names with
``surrogateescape`` for undecodable bytes, 512-byte blocks and 10240-byte records
(Python's ``tarfile`` defaults, as GNU tar writes them).
"""

from __future__ import annotations
import tarfile


BLOCK = tarfile.BLOCKSIZE          # 512


RECORD = tarfile.RECORDSIZE        # 10240


FORMAT = tarfile.PAX_FORMAT


ENCODING = "utf-8"


ERRORS = "surrogateescape"


def padded(n: int) -> int:
    """``n`` bytes rounded up to whole tar blocks (bytes)."""
    return -(-n // BLOCK) * BLOCK
