"""The ``dedup`` section: exact and near dedup inside a partition, and dataset-wide dedup
across partitions (``dedup.dataset``, ``mmpipe dedup``).
"""

from __future__ import annotations

from pydantic import Field

from pipeline.spec.base import _Strict


class DatasetDedupSpec(_Strict):
    """Dataset-wide dedup: hash index files written with each partition, and the dedup
    pass (``mmpipe dedup``) that groups duplicates across partitions without moving
    records (``pipeline.dedup``)."""

    enabled: bool = Field(False, description="Write hash index files (`_index/`) with each "
                          "partition and run the dedup pass after the main pass completes.")
    buckets: int = Field(16, ge=1, le=4096, description="Hash-range buckets per index kind: "
                         "the dedup pass's unit of work (one actor task and commit marker each).")
    exact: bool = Field(True, description="Group rows with equal source sha256.")
    near: bool = Field(True, description="Group rows whose pHash is within "
                       "max_hamming_distance bits (connected components).")
    max_hamming_distance: int = Field(4, ge=0, le=15, description="pHash Hamming threshold "
                                      "(bits); the index splits the 64 bits into this + 1 blocks.")
    semantic: bool = Field(False, description="SemDeDup: group rows whose image embeddings "
                           "(image_embedding must be enabled) are within a k-means cluster "
                           "and have cosine similarity >= semantic_threshold.")
    semantic_clusters: int = Field(16, ge=1, description="k-means clusters (also the semantic "
                                   "index's buckets).")
    semantic_threshold: float = Field(0.95, gt=0, le=1, description="Cosine similarity at or "
                                      "above which two embeddings are duplicates.")
    semantic_sample_size: int = Field(100_000, ge=1, description="Embeddings sampled "
                                      "(reservoir, streamed) to fit the k-means centroids.")
    frames: bool | None = Field(None, description="Video jobs: index each sampled frame's "
                                "pHash (`frame_phashes`) in the near index too, so the pass "
                                "finds a clip re-uploaded or re-encoded inside another video "
                                "and says which frames matched (`frame_index`, "
                                "`matched_frame`). Default: on when the frame signals are "
                                "written (`filters.clips` on, or `video.clips`).")
    workers: int | None = Field(None, ge=1, description="Dedup actors; default: the cluster's "
                                "CPUs. Never changes the result.")


class DedupSpec(_Strict):
    """Exact (sha256 of source bytes) and near (64-bit pHash) dedup inside a partition, and
    dataset-wide dedup across partitions (``dataset``)."""

    exact: bool = Field(True, description="Reject later rows whose source sha256 was seen.")
    near: bool = Field(True, description="Reject later rows whose pHash is within "
                       "max_hamming_distance of a kept row.")
    max_hamming_distance: int = Field(4, ge=0, le=64, description="pHash Hamming threshold (bits).")
    dataset: DatasetDedupSpec = Field(DatasetDedupSpec(), description="Dataset-wide dedup "
                                      "across partitions (`mmpipe dedup`).")
