"""In-process models: each worker process's own copy (``executors.ProcessWorkers``), the
plain-loop baseline and tests; no Ray.

``local_models(spec)`` loads every enabled model section's backend in this process and
returns what ``assembly.assemble(spec, models)`` takes: section -> ``(client, ModelInfo)``.
A ``LocalModelClient`` follows the client contract of ``steps.model`` (``submit``,
``result``, ``ready``); over a ``BatchServer`` the model computes in its own threads while
the caller goes on, like a ``ModelActor``.
"""

from __future__ import annotations

from typing import Any

from pipeline.spec import JobSpec


class LocalModelClient:
    """A client over a backend (``server(inputs)``) or a ``BatchServer``."""

    def __init__(self, server):
        self.server = server

    def submit(self, inputs: dict[str, Any]):
        if hasattr(self.server, "submit"):
            return self.server.submit(inputs)
        return self.server(inputs)

    def result(self, handle):
        return handle.result() if hasattr(handle, "result") else handle

    def ready(self, handle) -> bool:
        return handle.done() if hasattr(handle, "done") else True


def local_models(spec: JobSpec, device: str = "cpu", batch_server: bool = True,
                 client=LocalModelClient) -> dict[str, tuple]:
    """Every enabled model section loaded here: section -> ``(client, ModelInfo)``.

    ``batch_server``: serve through a ``BatchServer`` (coalescing, overlap) with the
    section's ``batch_size``; else call the backend directly. ``client``: the client
    class (tests wrap it to count calls).
    """
    from pipeline.models.registry import enabled_sections, load_backend

    sections = enabled_sections(spec)
    if not sections:   # a model-less job loads nothing (the serving module included)
        return {}
    from pipeline.models.serving import BatchServer

    out = {}
    for section in sections:
        backend = load_backend(section, spec, device)
        serving = getattr(spec, section)
        server = (BatchServer(backend, serving.batch_size, batch_wait_s=serving.batch_wait_s)
                  if batch_server else backend)
        out[section] = (client(server), backend.info)
    return out
