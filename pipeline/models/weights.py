"""Where model weights come from: a local directory, an ``s3://`` prefix or a Hugging Face id.

* ``check_weights(location, field)`` runs on the driver at job start. It is cheap (a
  listing and a few small reads, no download) and raises ``ModelLoadError`` naming the
  field and the location when the model is missing or partial: no ``config.json``, no
  weight files, a shard named by the index missing, or a ``.safetensors`` file shorter
  than its own header says (a truncated copy). It returns the parsed ``config.json``.
* ``fetch_weights(location)`` runs in the model actor and returns a local directory:
  a local directory as is; an ``s3://`` (or any non-local) prefix mirrored once per node
  into ``$MMPIPE_MODEL_CACHE`` (default ``~/.cache/mmpipe/models``) under a file lock,
  each file checked against the listed size, and reused by every later actor on that node
  while the listing (names, sizes, mtimes) is unchanged; a Hugging Face id through
  ``huggingface_hub.snapshot_download``, which honours ``HF_HUB_OFFLINE``.

Remote objects are read through ``pipeline.storage.fs`` only (the one module that knows URI
schemes). A cached copy is validated by size, and by ETag as soon as ``fs.list_files``
entries carry one (today they carry the size only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

from pipeline.errors import ModelLoadError
from pipeline.storage import fs
from pipeline.models.text import BUNDLED_MINILM

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
COMPLETE_MARKER = ".mmpipe-complete.json"
_HF_ID = re.compile(r"^(hf://)?[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CHUNK = 8 * 2**20


def kind_of(location: str) -> str:
    """``bundled``, ``local``, ``remote`` (``s3://`` ...) or ``hf`` (a Hugging Face id)."""
    if location == BUNDLED_MINILM:
        return "bundled"
    if not fs.is_local(location):
        return "hf" if location.startswith("hf://") else "remote"
    if os.path.exists(location) or location.startswith(("/", ".", "~", "file://")):
        return "local"
    return "hf" if _HF_ID.match(location) else "local"


def check_weights(location: str, field: str = "model") -> dict[str, Any]:
    """Verify at job start that ``location`` holds a complete model; return its config."""
    kind = kind_of(location)
    try:
        if kind == "bundled":
            from pipeline.models.text import resolve_model_dir

            return _check_files(resolve_model_dir(location))
        if kind == "hf":
            local = _hf_snapshot(location, check_only=True, field=field)
            if not any(n.endswith(WEIGHT_SUFFIXES) for n in os.listdir(local)):
                return json.loads(Path(local, "config.json").read_text())  # online, not cached
            return _check_files(local)
        return _check_files(location if kind == "remote" else os.path.expanduser(location))
    except ModelLoadError as e:
        raise ModelLoadError(f"{field} {location!r}: {e}") from None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{field} {location!r}: cannot read the model: {e}") from e


def fetch_weights(location: str, cache_root: str | None = None) -> str:
    """Return a local directory holding the model at ``location`` (see the module doc)."""
    kind = kind_of(location)
    if kind == "bundled":
        from pipeline.models.text import resolve_model_dir

        return resolve_model_dir(location)
    if kind == "local":
        return os.path.abspath(os.path.expanduser(location.removeprefix("file://")))
    if kind == "hf":
        return _hf_snapshot(location, check_only=False)
    return str(mirror_to_cache(location, cache_root))


def _listing(root: str) -> dict[str, tuple[int, str | None]]:
    """Relative path -> (size in bytes, ETag if the listing has one) of every file under
    ``root`` (a local path or a URI)."""
    base = fs.normalize(root).rstrip("/")
    out = {}
    for entry in fs.list_files(root):
        rel = entry.uri[len(base):].lstrip("/")
        out[rel] = (int(entry.size_bytes), getattr(entry, "etag", None))
    return out


def _check_files(root: str) -> dict[str, Any]:
    files = _listing(root)
    if not files:
        raise ModelLoadError("no such model directory (nothing listed there)")
    if "config.json" not in files:
        raise ModelLoadError(f"no config.json among {len(files)} files: not a model directory")
    weights = [f for f in files if f.endswith(WEIGHT_SUFFIXES) and "/" not in f]
    index = next((f for f in files if f.endswith(".index.json") and "/" not in f), None)
    if not weights and not index:
        raise ModelLoadError("config.json found but no weight files "
                             f"({', '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    if index:
        shards = set(json.loads(fs.read_bytes(fs.join(root, index)))["weight_map"].values())
        missing = sorted(s for s in shards if s not in files)
        if missing:
            raise ModelLoadError(f"{index} names shards that are missing: {missing}")
    for name in weights:
        if name.endswith(".safetensors"):
            _check_safetensors(fs.join(root, name), files[name][0], name)
        elif files[name][0] == 0:
            raise ModelLoadError(f"{name} is empty")
    return json.loads(fs.read_bytes(fs.join(root, "config.json")))


def _check_safetensors(uri: str, size: int, name: str) -> None:
    """A safetensors file is complete iff its size is 8 + header + the last tensor's end."""
    fsys, path = fs.resolve(uri)

    def read_header() -> bytes:
        with fsys.open_input_file(path) as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{name} is truncated ({size} bytes)")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > 100 * 2**20 or 8 + header_len > size:
                raise ModelLoadError(f"{name} is truncated or not safetensors ({size} bytes)")
            return f.read(header_len)
    raw = fs.with_retries(uri, "read", read_header)
    header_len = len(raw)
    header = json.loads(raw)
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
              default=0)
    if size != 8 + header_len + end:
        raise ModelLoadError(f"{name} is partial: {size} bytes, its header says "
                             f"{8 + header_len + end}")


def cache_dir_for(location: str, cache_root: str | None = None) -> Path:
    """The node-local cache directory of a remote model location."""
    root = Path(cache_root or os.environ.get("MMPIPE_MODEL_CACHE")
                or Path.home() / ".cache" / "mmpipe" / "models")
    tail = re.sub(r"[^\w.-]+", "_", location.rstrip("/").rsplit("/", 1)[-1])[:60]
    return root / f"{tail}-{hashlib.sha256(location.encode()).hexdigest()[:12]}"


def mirror_to_cache(location: str, cache_root: str | None = None) -> Path:
    """Copy every file under ``location`` into the node cache once; return the directory.

    Raises ``ModelLoadError`` (before copying anything) if an object name could write
    outside the cache directory (``..``, absolute; ``_cache_target``).

    Holds a file lock while checking and copying, so concurrent actors on a node download
    once and the others wait, then reuse. A cached copy is reused only while its recorded
    listing equals the current one; each file is checked against its listed size.
    """
    from filelock import FileLock

    dest = cache_dir_for(location, cache_root)
    dest.parent.mkdir(parents=True, exist_ok=True)
    listing = _listing(location)
    if not listing:
        raise ModelLoadError(f"{location!r}: no such model (nothing listed there)")
    want = {k: list(v) for k, v in sorted(listing.items())}
    for rel in want:
        _cache_target(dest, rel, location)  # refuse the whole model before copying
    with FileLock(str(dest) + ".lock", timeout=3600):
        marker = dest / COMPLETE_MARKER
        if marker.is_file() and json.loads(marker.read_text()) == want and all(
                (dest / rel).is_file() and (dest / rel).stat().st_size == size
                for rel, (size, _) in want.items()):
            log.info("model %s: reusing the node cache %s", location, dest)
            return dest
        log.info("model %s: copying %d files to %s", location, len(want), dest)
        if dest.exists():
            shutil.rmtree(dest)
        for rel, (size, _) in want.items():
            _copy_one(fs.join(location, rel), _cache_target(dest, rel, location), size)
        marker.write_text(json.dumps(want))
    return dest


def _cache_target(dest: Path, rel: str, location: str) -> Path:
    """``dest / rel`` for a listed object name ``rel``; raises ``ModelLoadError`` if the
    name could write outside ``dest``: absolute, empty, ``.``/``..`` parts, a backslash or
    a NUL (S3 keys may hold any of them)."""
    parts = rel.split("/")
    if (not rel or rel.startswith("/") or "\\" in rel or "\0" in rel
            or any(p in ("", ".", "..") for p in parts)):
        raise ModelLoadError(f"{location!r}: object name {rel!r} is not a safe relative path "
                             "in the model cache (absolute, empty or with '.'/'..' parts)")
    target = dest / Path(*parts)
    if not target.resolve().is_relative_to(dest.resolve()):
        raise ModelLoadError(f"{location!r}: object name {rel!r} leaves the model cache")
    return target


def _copy_one(uri: str, target: Path, size: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    fsys, path = fs.resolve(uri)
    with fsys.open_input_stream(path) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, _CHUNK)
    got = tmp.stat().st_size
    if got != size:
        tmp.unlink()
        raise ModelLoadError(f"{uri}: copied {got} bytes, the listing says {size}")
    os.replace(tmp, target)


def _hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _hf_snapshot(location: str, check_only: bool, field: str = "model") -> str:
    """A Hugging Face id -> its local snapshot directory in the Hugging Face cache
    (``huggingface_hub.snapshot_download(local_files_only=True)``: no network). Not cached:
    with ``HF_HUB_OFFLINE`` on (``mmpipe run`` sets it) a ``ModelLoadError`` says how to
    provide the model, with no request sent; online, the Hub is asked (``check_only``:
    the file list and ``config.json``, never the weights)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo_id = location.removeprefix("hf://")
    try:
        return snapshot_download(repo_id, local_files_only=True)
    except LocalEntryNotFoundError as e:
        if _hf_offline():
            raise ModelLoadError(
                f"not in the local Hugging Face cache ({constants.HF_HUB_CACHE}), and mmpipe "
                "runs offline (HF_HUB_OFFLINE=1). To provide it: on a machine online, run "
                f"`hf download {repo_id}` and copy its Hugging Face cache here (or point "
                "HF_HOME at a copy); or save the model and its processor with "
                f"save_pretrained() to a directory and set {field} to that path, or to an "
                "s3:// prefix holding it") from e
    try:
        return _hf_remote_config_dir(repo_id) if check_only else snapshot_download(repo_id)
    except Exception as e:  # HTTP errors, and the HTTP client's own (connection refused...)
        raise ModelLoadError(f"Hugging Face model {repo_id!r}: {type(e).__name__}: {e}") from e


def _hf_remote_config_dir(repo_id: str) -> str:
    """Online and not cached: check the repository lists a config and weights; fetch only
    ``config.json`` and return a directory holding it."""
    from huggingface_hub import HfApi, hf_hub_download

    files = HfApi().list_repo_files(repo_id)
    if "config.json" not in files or not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        raise ModelLoadError(f"Hugging Face model {repo_id!r} lists no config.json or no "
                             "weight files")
    return str(Path(hf_hub_download(repo_id, "config.json")).parent)
