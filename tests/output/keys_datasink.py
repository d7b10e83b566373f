"""A datasink added the documented way (DESIGN.md, "Extending the pipeline", "Add a
datasink"): this one module, a ``FileDatasink`` subclass with its ``name`` and
``directory``, named in the spec's ``sink.datasinks`` by import path (``pipeline.plugins``;
a built-in one would be an entry in ``assembly.DATASINK_FACTORIES``).

It writes the keys of an attempt's ``ok`` rows, one per line, to
``keys/<pid>/a-<attempt>/keys.txt``; ``delay_s`` makes each batch slow, so a test can run
gc while the attempt is live."""

from __future__ import annotations

import time

from pipeline.columns import KEY, STATUS
from pipeline.output.sinks.base import FileDatasink
from pipeline.records import Status


class KeysDatasink(FileDatasink):
    """``ok`` keys of an attempt as UTF-8 lines."""

    name = "keys"
    directory = "keys"

    def __init__(self, output_uri: str, delay_s: float = 0.0):
        super().__init__(output_uri)
        self.delay_s = delay_s

    def on_write_start(self, partition_id, attempt_id, schema):
        super().on_write_start(partition_id, attempt_id, schema)
        self.rel = f"{self.attempt_dir}/keys.txt"
        self.out = self.open_file(self.rel)
        self.rows = 0

    def write(self, batch):
        for key, status in zip(batch[KEY], batch[STATUS]):
            if status == Status.OK.value:
                self.out.write(f"{key}\n".encode())
                self.rows += 1
        time.sleep(self.delay_s)

    def _finish(self):
        self.finish_file(self.rel, self.rows)
