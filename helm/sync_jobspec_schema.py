"""Embed the job spec's JSON Schema (``pipeline.spec_doc.json_schema()``, generated from the
pydantic ``JobSpec``: one source of truth) into the chart's ``values.schema.json``, so that
``helm install`` / ``helm template`` / ``helm lint`` refuse a ``jobSpec.spec`` that
``mmpipe validate`` would refuse for its shape (unknown fields, types, bounds; the
cross-field rules of the validators stay with ``mmpipe validate`` and the chart tests).

    .venv/bin/python helm/sync_jobspec_schema.py          # rewrite values.schema.json
    .venv/bin/python helm/sync_jobspec_schema.py --check  # exit 1 if it is stale

The JobSpec schema goes to ``$defs.JobSpec`` and its own ``$defs`` beside it (pydantic's
references are ``#/$defs/<Model>``, which then resolve from the root), and
``properties.jobSpec.properties.spec`` refers to it. tests/deploy/test_helm.py regenerates
it and compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCHEMA = Path(__file__).resolve().parent / "mmpipe" / "values.schema.json"
DESCRIPTION = ("The mmpipe job spec (JobSpec YAML), checked at install against the schema "
               "generated from pipeline/spec/ (helm/sync_jobspec_schema.py).")


def synced(values_schema: dict) -> dict:
    """``values_schema`` with the current JobSpec schema embedded (a new dict)."""
    from pipeline.spec_doc import json_schema

    job = json_schema()
    job.pop("$schema", None)
    defs = job.pop("$defs", {})
    out = dict(values_schema)
    out["$defs"] = {"JobSpec": job, **dict(sorted(defs.items()))}
    props = dict(out["properties"])
    job_spec = dict(props["jobSpec"])
    job_props = dict(job_spec["properties"])
    job_props["spec"] = {"description": DESCRIPTION,
                         "anyOf": [{"type": "null"}, {"$ref": "#/$defs/JobSpec"}]}
    job_spec["properties"] = job_props
    props["jobSpec"] = job_spec
    out["properties"] = props
    return out


def render(schema: dict) -> str:
    """The file's text: two-space JSON and a final newline."""
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str]) -> int:
    """Rewrite values.schema.json, or with ``--check`` report whether it is current."""
    current = SCHEMA.read_text()
    wanted = render(synced(json.loads(current)))
    if "--check" in argv:
        if current != wanted:
            print(f"{SCHEMA} is stale: run .venv/bin/python helm/sync_jobspec_schema.py",
                  file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
