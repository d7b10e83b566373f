"""Submit, follow and stop mmpipe jobs on a Ray cluster through its job API (port 8265).

A submitted job runs ``python -m pipeline run SPEC ...`` as the Ray job's driver on the
head: ``python`` is the head's (its PATH), except for a head on this machine (a loopback
address, not ``--installed``), where it is the interpreter running ``mmpipe`` here, so a
local head works without an activated virtual environment (``entrypoint``). The code
reaches the cluster in one of two ways:
- ``working_dir`` (default): this checkout is zipped and uploaded (``.venv``, ``output``,
  ``bench/out``, ``.git``, ``tests`` left out), so the spec and relative inputs travel with it;
- ``installed``: the cluster image already has mmpipe (the Dockerfile); only the spec file
  is uploaded, so its inputs and outputs must be absolute or ``s3://`` URIs.

``.env`` files (any ``.env`` / ``.env.*``), credential-looking files and folders
(``CREDENTIAL_EXCLUDES``: ``.aws/``, ``.ssh/``, ``.ray/``, ``*.pem``, ``*.key``, ``id_rsa*``,
``credentials*``, ``.netrc``, ``*token``, ...; ``--exclude PATTERN`` adds more, gitignore
syntax) and, when it is a local path inside the working dir, the job's output location
are left out of the upload too; ``submit`` prints how many files it uploads and names
the credential-looking ones it left out (``upload_plan``, Ray's own matcher). ``--env``
values never go into the job's ``runtime_env.env_vars`` (the job API shows those to anyone): they
travel in a package of their own (``pipeline.runtime.job_env``).

The Ray auth token (Ray >= 2.52 token authentication; KubeRay ``authOptions``) is read from
``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``, and
sent as ``Authorization: Bearer``. Nothing here retries a failed job: resubmitting the same
spec resumes from the commit markers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

from pipeline.errors import MmpipeError
from pipeline.runtime import head, job_env

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
WORKING_DIR_EXCLUDES = [".git", ".venv", "venv", "output", "bench/out", "tests",
                        ".pytest_cache", "*.egg-info", "**/__pycache__", "*.pyc",
                        ".env", ".env.*", "**/.env", "**/.env.*"]
#: Credential-looking names never uploaded with a working_dir (gitignore syntax, matched
#: at any depth by Ray's own matcher): cloud/SSH/Ray/GPG/Docker/Kubernetes config folders,
#: private keys and keystores, credential and token files, netrc-style password files.
#: ``--exclude PATTERN`` (``mmpipe submit``) adds more. ``*token`` and friends are narrow on
#: purpose: a model's ``tokenizer.json`` must still travel.
CREDENTIAL_EXCLUDES = [".aws/", ".ssh/", ".ray/", ".gnupg/", ".docker/", ".kube/",
                       ".config/gcloud/", ".azure/", "*.pem", "*.key", "*.p12", "*.pfx",
                       "*.jks", "*.keystore", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
                       "credentials*", "*-credentials*", "*_credentials*", "*secret*",
                       ".netrc", "_netrc", ".pgpass", ".git-credentials", ".npmrc", ".pypirc",
                       "*token", "*.token", "*token.txt", "*token.json", "*token.yaml",
                       "auth_token*", "kubeconfig*", "*.kubeconfig"]
#: Excluded files named on the console (the rest are counted).
SHOW_EXCLUDED = 50
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# ``mmpipe run`` sets these itself (ray.init runtime_env); Ray refuses a job whose
# runtime_env sets the same variable, so they may not be passed with --env.
RESERVED_ENV = ("HF_HUB_OFFLINE",)


class SubmitError(MmpipeError):
    """The job could not be submitted, found or stopped (bad address, token, id)."""


@dataclasses.dataclass(frozen=True)
class UploadPlan:
    """What a submission uploads: ``files`` (paths relative to ``root``, sorted),
    ``size_bytes`` (their total) and ``excluded`` (the credential-looking and
    ``--exclude``-matched files left out, relative to ``root``, sorted)."""

    root: str
    files: tuple[str, ...]
    size_bytes: int
    excluded: tuple[str, ...]

    def describe(self) -> str:
        """Two lines for the console: the count and size, then what was left out."""
        lines = [(f"  upload:    {len(self.files)} files, {self.size_bytes / 2**20:.1f} MiB "
                  f"from {self.root}")]
        shown = ", ".join(self.excluded[:SHOW_EXCLUDED]) if self.excluded else "none"
        more = len(self.excluded) - SHOW_EXCLUDED
        lines.append(f"  excluded:  {shown}{f' and {more} more' if more > 0 else ''} "
                     "(credential-looking or --exclude)")
        return "\n".join(lines)


def upload_plan(root: Path, pruned: list[str],
                named: list[str] | tuple[str, ...] = ()) -> UploadPlan:
    """The files Ray uploads from the working dir ``root`` with the excludes ``pruned +
    named`` (Ray's own traversal and gitignore matcher, ``ray._private.runtime_env.
    packaging``, honouring ``.gitignore`` files as Ray does), and the files ``named``
    leaves out (``CREDENTIAL_EXCLUDES`` and ``--exclude`` patterns)."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    others = list(pruned)
    cred = _get_excludes(root, list(named)) if named else (lambda p: False)
    files: list[str] = []
    excluded: list[str] = []
    total = 0

    def seen(p: Path) -> None:
        nonlocal total
        if not p.is_file():
            return
        rel = p.relative_to(root).as_posix()
        if cred(p):
            excluded.append(rel)
        else:
            files.append(rel)
            total += p.stat().st_size

    # the other excludes prune as Ray prunes; the named ones classify what remains
    gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
    _dir_travel(root, [_get_excludes(root, others)], seen, include_gitignore=gitignore)
    return UploadPlan(str(root), tuple(sorted(files)), total, tuple(sorted(excluded)))


@dataclasses.dataclass(frozen=True)
class Submission:
    submission_id: str
    address: str
    entrypoint: str
    upload: UploadPlan | None = None

    @property
    def dashboard_url(self) -> str:
        return f"{self.address}/#/jobs/{self.submission_id}"


def resolve_address(address: str | None) -> str:
    """``--address``, else ``RAY_API_SERVER_ADDRESS`` / an http ``RAY_ADDRESS``, else local."""
    address = (address or os.environ.get("RAY_API_SERVER_ADDRESS")
               or (os.environ.get("RAY_ADDRESS", "") if "://" in os.environ.get("RAY_ADDRESS", "")
                   else "") or DEFAULT_ADDRESS)
    if "://" not in address:
        address = f"http://{address}"
    if not address.startswith(("http://", "https://")):
        raise SubmitError(f"--address {address!r}: use the dashboard's http(s)://HOST:8265 URL")
    return address.rstrip("/")


def is_loopback(address: str | None) -> bool:
    """True if the job API at ``address`` (see ``resolve_address``) is on a loopback host
    (``127.0.0.1``, ``localhost``, ``::1``): a local head, or a port-forward to a remote one."""
    host = urllib.parse.urlsplit(resolve_address(address)).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def entrypoint(args: list[str], python: str | None = None) -> str:
    """The job's shell command for ``args`` (``python -m pipeline run ...``, see
    ``run_args``). With ``python`` (an absolute interpreter path) the command runs that
    interpreter where it exists on the head and ``python`` from the head's PATH otherwise
    (a loopback address may be a port-forward to a remote cluster)."""
    if python is None:
        return shlex.join(args)
    return (f'PY={shlex.quote(python)}; [ -x "$PY" ] || PY=python; "$PY" '
            + shlex.join(args[1:]))


def auth_token() -> str | None:
    """The Ray auth token from the environment (see module docstring), or None."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def client(address: str | None):
    """A ``JobSubmissionClient`` for ``address`` carrying the auth token. Raises SubmitError."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    url = resolve_address(address)
    token = auth_token()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        return JobSubmissionClient(url, headers=headers)
    except AuthenticationError as e:
        what = "the auth token" if token else "a request without an auth token"
        raise SubmitError(f"{url} refused {what}: {_first_line(e)} (set RAY_AUTH_TOKEN to "
                          "the cluster's token)") from e
    except (ConnectionError, RuntimeError) as e:
        raise SubmitError(f"cannot reach the Ray job API at {url}: {_first_line(e)}") from e


def find_checkout(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding the ``pipeline`` package."""
    for d in [start, *start.parents]:
        if (d / "pipeline" / "__init__.py").is_file():
            return d
    raise SubmitError(f"no mmpipe checkout (a directory with pipeline/) at or above {start}; "
                      "pass --working-dir, or --installed if the cluster image has mmpipe")


def run_args(spec_rel: str, sets: list[str], input_uri: str | None, output_uri: str | None,
             mode: str | None) -> list[str]:
    """The ``mmpipe run`` command line the job's driver runs."""
    args = ["python", "-m", "pipeline", "run", spec_rel]
    for flag, value in (("--input", input_uri), ("--output", output_uri), ("--mode", mode)):
        if value:
            args += [flag, value]
    for s in sets:
        args += ["--set", s]
    return args


def output_exclude(root: Path, output_uri: str | None) -> list[str]:
    """The ``excludes`` pattern (gitignore syntax, anchored at ``root``) of a local output
    location inside ``root``, so a job's earlier output is never uploaded; ``[]`` for an
    ``s3://`` output or one outside ``root``."""
    if not output_uri or "://" in output_uri and not output_uri.startswith("file://"):
        return []
    out = Path(output_uri.removeprefix("file://")).expanduser()
    out = (out if out.is_absolute() else root / out).resolve()
    if out == root or not out.is_relative_to(root):
        return []
    return ["/" + out.relative_to(root).as_posix()]


def submit(spec_path: str, run_argv: list[str], *, address: str | None = None,
           working_dir: str | None = None, installed: bool = False,
           env: dict[str, str] | None = None, job_name: str = "job",
           submission_id: str | None = None, metadata: dict[str, str] | None = None,
           output_uri: str | None = None, exclude: list[str] | tuple[str, ...] = (),
           out=None) -> Submission:
    """Submit ``mmpipe run`` for ``spec_path``; ``run_argv`` are the run options after SPEC.

    The working dir is uploaded without ``WORKING_DIR_EXCLUDES``, ``CREDENTIAL_EXCLUDES``,
    ``exclude`` (more gitignore patterns) and a local output inside it; ``out`` (a text
    stream, e.g. ``sys.stdout``): where ``UploadPlan.describe`` is printed before the upload.

    The job's Python is this process's interpreter when the head is on a loopback address
    and not ``installed`` (``entrypoint``), else ``python`` on the head's PATH. ``env``
    values reach every process of the job through ``job_env`` (never the job's
    ``env_vars``). ``output_uri`` (the job's output) is left out of the upload when it is
    a local path inside the working dir. Raises ``SubmitError``."""
    bad = sorted(set(env or {}) & set(RESERVED_ENV))
    if bad:
        raise SubmitError(f"--env {', '.join(bad)}: set by mmpipe run itself")
    spec = Path(spec_path).resolve()
    staging = None
    if installed:
        staging = Path(tempfile.mkdtemp(prefix="mmpipe-submit-"))
        shutil.copy(spec, staging / spec.name)
        root, spec_rel = staging, spec.name
        pruned: list[str] = []
        named: list[str] = []
    else:
        root = Path(working_dir).resolve() if working_dir else find_checkout(Path.cwd())
        if not spec.is_relative_to(root):
            raise SubmitError(f"{spec_path}: the spec must be inside the working dir {root} "
                              "(it is uploaded with it)")
        spec_rel = spec.relative_to(root).as_posix()
        pruned = WORKING_DIR_EXCLUDES + output_exclude(root, output_uri)
        named = CREDENTIAL_EXCLUDES + list(exclude)
    excludes = pruned + named
    python = None if installed or not is_loopback(address) else sys.executable
    command = entrypoint(run_args(spec_rel, [], None, None, None) + run_argv, python)
    runtime_env: dict = {"working_dir": str(root), "excludes": excludes, "env_vars": {}}
    secrets = None
    sid = submission_id or f"mmpipe-{job_name}-{uuid.uuid4().hex[:8]}"
    try:
        plan = upload_plan(root, pruned, named)
        if spec_rel not in plan.files:
            raise SubmitError(f"{spec_path}: the spec itself is excluded from the upload "
                              f"({', '.join(plan.excluded) or 'by an exclude pattern'}); "
                              "rename it")
        if out is not None:
            print(plan.describe(), file=out)
            out.flush()
        secrets = Path(tempfile.mkdtemp(prefix="mmpipe-env-")) if env else None
        if secrets:
            pkg = job_env.write_package(dict(env), secrets)
            runtime_env["py_modules"] = [str(pkg)]
            runtime_env["env_vars"] = {job_env.ENV_MODULE: pkg.name}
        jobs = client(address)
        sid = _submit_with_retry(jobs, command, runtime_env, sid, metadata or {})
    finally:
        for tmp in (staging, secrets):
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    return Submission(sid, jobs.get_address(), command, plan)


def _submit_with_retry(jobs, entrypoint: str, runtime_env: dict, sid: str,
                       metadata: dict[str, str], timeout_s: float = 60) -> str:
    """Submit; retry while a just-started head has no job agent yet."""
    deadline = time.time() + timeout_s
    while True:
        try:
            return jobs.submit_job(entrypoint=entrypoint, runtime_env=runtime_env,
                                   submission_id=sid, metadata=metadata,
                                   entrypoint_num_cpus=0)
        except RuntimeError as e:
            port_taken = head.submit_failure(str(e))   # the agent lost its port: one line
            if port_taken:
                raise SubmitError(f"submit failed: {port_taken}") from e
            if "No available agent" not in str(e) or time.time() > deadline:
                raise SubmitError(f"submit failed: {_first_line(e)}") from e
            time.sleep(2)


def wait(jobs, submission_id: str, follow: bool, out=None) -> str:
    """Wait for a terminal status, streaming the logs to ``out`` if ``follow``; return it."""
    if follow:
        asyncio.run(_tail(jobs, submission_id, out))
    while (status := _status(jobs, submission_id)) not in TERMINAL:
        time.sleep(1)
    return status


def _status(jobs, submission_id: str) -> str:
    status = jobs.get_job_status(submission_id)
    return str(getattr(status, "value", status))


async def _tail(jobs, submission_id: str, out) -> None:
    async for chunk in jobs.tail_job_logs(submission_id):
        out.write(chunk)
        out.flush()


def logs(jobs, submission_id: str) -> str:
    try:
        return jobs.get_job_logs(submission_id)
    except RuntimeError as e:
        raise SubmitError(f"{submission_id}: {_first_line(e)}") from e


def stop(jobs, submission_id: str) -> bool:
    """Ask the job to stop; True if it was running."""
    try:
        return jobs.stop_job(submission_id)
    except RuntimeError as e:
        raise SubmitError(f"{submission_id}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
