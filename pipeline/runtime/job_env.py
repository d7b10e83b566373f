"""Environment variables passed with ``mmpipe submit --env``, kept out of Ray's job API.

Ray's job API (``ray job list``, the dashboard, ``JobSubmissionClient.get_job_info``)
shows a job's whole ``runtime_env``, ``env_vars`` included, to anyone who can reach the
dashboard port. So ``submit`` puts the values in a small package of their own instead: a
directory ``mmpipe_job_env_<hex>/`` holding ``env.json`` (mode 0600) uploaded as a
``runtime_env`` ``py_modules`` entry (the job API lists only its content-hashed URI and
serves no package content); the job's ``env_vars`` carry only the package's name in
``MMPIPE_JOB_ENV_MODULE``. Every mmpipe process of the job (the driver, PartitionWorkers,
ModelActors, dedup tasks) calls ``apply()`` first, which sets the variables in
``os.environ``. Values are never logged; ``describe`` names the keys only.
"""

from __future__ import annotations

import importlib
import importlib.resources
import json
import logging
import os
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

ENV_MODULE = "MMPIPE_JOB_ENV_MODULE"
_FILE = "env.json"


def write_package(env: dict[str, str], parent: Path) -> Path:
    """Write the package holding ``env`` under ``parent``; return its directory (a
    ``py_modules`` entry). The values file is readable by its owner only."""
    pkg = parent / f"mmpipe_job_env_{uuid.uuid4().hex[:12]}"
    pkg.mkdir(mode=0o700)
    (pkg / "__init__.py").write_text('"""Values of mmpipe submit --env (see '
                                     'pipeline.runtime.job_env)."""\n')
    fd = os.open(pkg / _FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(env, f)
    return pkg


def apply() -> list[str]:
    """Set this job's ``--env`` variables in ``os.environ`` if ``MMPIPE_JOB_ENV_MODULE``
    names their package; return the keys set (sorted; ``[]`` outside a submitted job).
    Raises ``ImportError`` if the package named is not importable (not uploaded)."""
    name = os.environ.get(ENV_MODULE, "")
    if not name:
        return []
    values = json.loads(importlib.resources.files(importlib.import_module(name))
                        .joinpath(_FILE).read_text())
    os.environ.update({str(k): str(v) for k, v in values.items()})
    return sorted(values)


def describe(env: dict[str, str]) -> str:
    """``KEY1, KEY2 (values not shown)``: how mmpipe prints ``--env`` variables."""
    return f"{', '.join(sorted(env))} (values not shown)" if env else "none"
