"""mmpipe: a streaming multimodal ETL service on Ray.

The import package is ``pipeline``; the console script is ``mmpipe``. See DESIGN.md
(architecture) and README.md (how to run). Import direction:
``cli -> runtime -> assembly -> {read, models} -> {steps, dedup} -> {input, output}
-> {storage, media} -> ground`` (DESIGN.md, Layout; ``tests/house_rules.py`` checks it).
``pipeline.read_output(output)`` reads a job's committed output (``pipeline.read``).
"""

from __future__ import annotations

import functools

__version__ = "0.1.0"
__all__ = ["__version__", "package_version", "read_output"]


@functools.cache
def package_version() -> str:
    """The installed ``mmpipe`` distribution's version (``importlib.metadata``), else
    ``__version__`` (a source checkout that is not installed, e.g. a Ray job's working_dir)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("mmpipe")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def __getattr__(name: str):
    """``pipeline.read_output`` (``pipeline.read.read_output``), imported on first use
    so that ``import pipeline`` stays light (PEP 562)."""
    if name == "read_output":
        from pipeline.read import read_output

        return read_output
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
