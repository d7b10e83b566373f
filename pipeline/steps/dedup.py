"""Exact and near-duplicate detection inside one partition (no shuffle, no global state).

Exact: a row whose source ``sha256`` equals an earlier kept row's. Near: a row whose
64-bit ``phash`` is within ``max_hamming_distance`` bits of an earlier kept row's (``phash``
is an int64 holding the 64 bits, ``steps.image.phash64``; it is compared as uint64, so the
sign bit counts like any other). A row flagged ``low_detail`` (``media.transform.low_detail``:
a solid colour, 1x1 image or plain gradient, whose pHash says nothing about the image) is
never a near duplicate nor kept for near matching: only its sha256 is compared. The
column is optional (absent: every pHash is used), so it is not in ``reads``.
Duplicates get ``status="rejected"``, ``reject_reason="duplicate"``, ``duplicate_of``
(the kept row's key) and ``duplicate_hamming`` (bits; 0 for an exact byte match).
The first occurrence in partition order is kept. Memory: 8 bytes per kept pHash (an
array grown by doubling, so keeping n hashes costs O(n)) plus one dict entry per kept
sha256, for the partition only; a near lookup is one vectorised XOR + popcount over the
kept hashes.
"""

from __future__ import annotations

import numpy as np

from pipeline.columns import (
    DUPLICATE_HAMMING,
    DUPLICATE_OF,
    KEY,
    LOW_DETAIL,
    PHASH,
    REJECT_REASON,
    SHA256,
)
from pipeline.records import RejectReason
from pipeline.spec import DedupSpec
from pipeline.steps.base import Filter


class DedupStep(Filter):
    """Stateful per partition: call ``start_partition`` before each partition."""

    writes = (REJECT_REASON, DUPLICATE_OF, DUPLICATE_HAMMING)

    def __init__(self, spec: DedupSpec):
        super().__init__()
        self.spec = spec
        # the hashes it compares (steps.image.needed_hashes computes only those)
        self.reads = (KEY,) + ((SHA256,) if spec.exact else ()) + ((PHASH,) if spec.near else ())
        self.start_partition("")

    def settings(self):
        return self.spec.model_dump(mode="json", exclude={"dataset"})  # the index sink's

    def start_partition(self, partition_id: str) -> None:
        super().start_partition(partition_id)
        self._sha: dict[str, str] = {}
        self._hashes = np.zeros(64, dtype=np.uint64)  # kept pHashes in [:n], grown by doubling
        self._n = 0
        self._keys: list[str] = []

    def _keep(self, phash: int, key: str) -> None:
        if self._n == self._hashes.size:
            self._hashes = np.concatenate([self._hashes, np.zeros_like(self._hashes)])
        self._hashes[self._n] = _bits(phash)
        self._n += 1
        self._keys.append(key)

    def _near(self, phash: int) -> tuple[str, int] | None:
        if not self.spec.near or self._n == 0:
            return None
        dist = np.bitwise_count(self._hashes[:self._n] ^ _bits(phash))
        j = int(np.argmin(dist))
        return (self._keys[j], int(dist[j])) if dist[j] <= self.spec.max_hamming_distance else None

    def reject_reason(self, batch, i):
        key = batch[KEY][i]
        sha = batch[SHA256][i] if self.spec.exact else None
        ph = batch[PHASH][i] if self.spec.near else None
        low = batch.get(LOW_DETAIL)
        if low is not None and low[i]:
            ph = None                    # a flat image's pHash is not evidence of anything
        hit = (self._sha[sha], 0) if sha is not None and sha in self._sha else None
        hit = hit or (self._near(ph) if ph is not None else None)
        if hit:
            batch[DUPLICATE_OF][i], batch[DUPLICATE_HAMMING][i] = hit
            return RejectReason.DUPLICATE
        if sha is not None:
            self._sha.setdefault(sha, key)
        if ph is not None:
            self._keep(ph, key)
        return None


def _bits(phash: int) -> np.uint64:
    """The 64 bits of a pHash (int64 two's complement, or an unsigned int) as uint64
    (``np.bitwise_count`` of a signed value counts the bits of its absolute value)."""
    return np.uint64(int(phash) & 0xFFFF_FFFF_FFFF_FFFF)
