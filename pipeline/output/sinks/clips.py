"""The clip datasink (``video.clips``): each ``ok`` clip row's clip file, under the attempt.

``ClipEncodeStep`` (``steps/clips.py``) leaves each clip in a local temporary file
(``_clip_file``); this datasink copies it, streaming and hashing, to
``clips/<pid>/a-<attempt>/<n:06d>.mp4`` (``n``: the attempt's clip rows in input order,
from 0, so the names do not depend on what a key holds) and sets the row's ``clip_path``
(relative to the output root: ``_generations/g-000002/clips/...`` for a later generation,
``--mode overwrite``, whose files stay where they are written) before the other datasinks write the batch (the assembler
puts it first). The files are named by the commit marker like every other output file,
so an uncommitted attempt's clips are never read, gc and ``--mode overwrite`` delete
them, and a resumed attempt writes its own. The temporary files are deleted by the
runner once every datasink has written the batch.
"""

from __future__ import annotations

import shutil

import pyarrow as pa

from pipeline.columns import CLIP_FILE, CLIP_PATH, STATUS, Batch
from pipeline.output.generations import output_of
from pipeline.output.sinks.base import FileDatasink
from pipeline.records import Status

#: Bytes copied at a time from a clip's temporary file.
COPY_CHUNK_BYTES = 1 << 20


class ClipDatasink(FileDatasink):
    """Clip files of ``ok`` rows that have a ``_clip_file`` (module docstring)."""

    name = "clips"
    directory = "clips"

    def on_write_start(self, partition_id: str, attempt_id: str, schema: pa.Schema) -> None:
        super().on_write_start(partition_id, attempt_id, schema)
        self.clips = 0
        root, output = self.layout.root, output_of(self.layout.root)
        self.prefix = root[len(output):].strip("/") + "/" if root != output else ""

    def write(self, batch: Batch) -> None:
        """Copy each ``ok`` row's ``_clip_file`` under the attempt directory and set its
        ``clip_path``. Raises ``OSError``/``StorageError`` (the attempt fails)."""
        files = batch.get(CLIP_FILE)
        if files is None:
            return
        paths = batch.setdefault(CLIP_PATH, [None] * len(batch[STATUS]))
        for i, status in enumerate(batch[STATUS]):
            if status != Status.OK.value or not files[i]:
                continue
            rel = f"{self.attempt_dir}/{self.clips:06d}.mp4"
            self.clips += 1
            out = self.open_file(rel)
            with open(files[i], "rb") as f:
                shutil.copyfileobj(f, out, COPY_CHUNK_BYTES)
            self.finish_file(rel, 1)
            paths[i] = self.prefix + rel
