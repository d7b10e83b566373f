"""A datasink that writes chosen columns of an attempt's ``ok`` rows as JSON Lines, to
``jsonl/<partition>/a-<attempt>/rows.jsonl`` (named by the commit marker like every other
output file; gc, generations and ``mmpipe ls --kind jsonl`` know the directory)."""

from __future__ import annotations

import json

from pipeline.columns import STATUS
from pipeline.output.sinks.base import FileDatasink
from pipeline.records import Status


class JsonlDatasink(FileDatasink):
    """One JSON object per ``ok`` row with the keys ``columns`` (a column the batch does
    not hold is null). Raises ``ValueError`` for an empty or non-string ``columns``."""

    name = "jsonl"
    directory = "jsonl"

    def __init__(self, output_uri: str, columns: list[str] = ("key", "caption")):
        super().__init__(output_uri)
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise ValueError(f"columns must be a non-empty list of column names, got "
                             f"{columns!r}")
        self.columns = list(columns)

    def settings(self):
        return {"columns": self.columns}

    def on_write_start(self, partition_id, attempt_id, schema):
        super().on_write_start(partition_id, attempt_id, schema)
        self.rel = f"{self.attempt_dir}/rows.jsonl"
        self.out = self.open_file(self.rel)
        self.rows = 0

    def write(self, batch):
        for i, status in enumerate(batch[STATUS]):
            if status != Status.OK.value:
                continue
            row = {c: batch[c][i] if c in batch else None for c in self.columns}
            self.out.write((json.dumps(row, ensure_ascii=False, default=str) + "\n").encode())
            self.rows += 1

    def _finish(self):
        self.finish_file(self.rel, self.rows)
