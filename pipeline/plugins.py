"""Plugins: steps, datasources and datasinks from the user's own package.

A job spec names a plugin class in a ``uses`` field (``steps[i].uses``, ``source.uses``,
``sink.datasinks[i].uses``), in one of three forms:

* ``package.module:Class`` (the entry-point object syntax; ``Class`` may be dotted),
* ``package.module.Class`` (the last dot splits module and class),
* ``name`` (no dot, no colon): an entry point registered under ``mmpipe.steps``,
  ``mmpipe.datasources`` or ``mmpipe.datasinks`` by an installed distribution
  (``importlib.metadata.entry_points``).

``load(uses, group, base, field)`` imports the class and checks it subclasses ``base``;
``Plugin.make(*args)`` constructs it with the spec's ``with`` mapping as keyword
arguments. Every failure (module missing, attribute missing, exception at import, entry
point not found, wrong base class, constructor refusing the settings) is a ``SpecError``
naming ``field`` and the value, raised before anything runs.

``Plugin.identity()`` goes into the fingerprint: the class's import path, the
distribution that provides its module and that distribution's version
(``importlib.metadata``); a module that no installed distribution provides (a checkout on
``PYTHONPATH``, a test module) has distribution and version None and instead the sha256
of the file that defines the class, so editing that file changes the fingerprint too.
The whole ``with`` mapping is fingerprinted as well: mmpipe cannot tell which of a
plugin's settings leave its rows unchanged.

Ground floor: this module imports no room; the caller passes the base class.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import inspect
import re
from typing import Any

from pipeline.errors import SpecError, clip, short_repr

#: The entry point groups of steps, datasources and datasinks.
STEPS, DATASOURCES, DATASINKS = "mmpipe.steps", "mmpipe.datasources", "mmpipe.datasinks"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_NAME}(?:\.{_NAME})*"
#: ``module:Class``, ``module.Class`` or an entry point name (letters, digits, ``_``, ``-``).
USES_PATTERN = re.compile(rf"^(?:{_DOTTED}:{_DOTTED}|{_NAME}(?:\.{_NAME})+|"
                          r"[A-Za-z0-9][A-Za-z0-9_-]*)$")


@dataclasses.dataclass(frozen=True)
class Plugin:
    """A loaded plugin class: ``field`` (e.g. ``steps[0]``), ``cls``, where it came from
    (``distribution``/``version``, or ``file_sha256`` of a module from no distribution)
    and its ``settings`` (the spec's ``with`` mapping, JSON values)."""

    field: str
    cls: type
    distribution: str | None
    version: str | None
    file_sha256: str | None
    settings: dict[str, Any]

    @property
    def path(self) -> str:
        """``module:QualifiedName`` of the class."""
        return f"{self.cls.__module__}:{self.cls.__qualname__}"

    def identity(self) -> dict[str, Any]:
        """What the fingerprint holds for this plugin (see the module docstring)."""
        return {"class": self.path, "distribution": self.distribution,
                "version": self.version, "file_sha256": self.file_sha256,
                "with": self.settings}

    def describe(self) -> str:
        """``module:Class (distribution version)`` or ``module:Class (file sha256 ...)``."""
        origin = (f"{self.distribution} {self.version}" if self.distribution
                  else f"no distribution, file sha256 {(self.file_sha256 or '?')[:12]}")
        return f"{self.path} ({origin})"

    def make(self, *args: Any) -> Any:
        """``cls(*args, **settings)``. Raises ``SpecError`` naming ``<field>.with`` when
        the constructor raises (an unknown keyword, a bad value)."""
        try:
            return self.cls(*args, **self.settings)
        except Exception as e:  # noqa: BLE001 - boundary: the user's constructor
            raise SpecError(f"{self.field}.with: {self.path} refused its settings "
                            f"{short_repr(self.settings)}: {type(e).__name__}: "
                            f"{clip(str(e), 500)}", f"{self.field}.with", self.settings) from e


def load(uses: str, group: str, base: type, field: str, settings: dict[str, Any]) -> Plugin:
    """Import the class ``uses`` names (see the module docstring) for the spec field
    ``field`` (``steps[0]``); ``group`` is the entry point group of a bare name. Raises
    ``SpecError`` naming ``<field>.uses`` and ``uses`` when it cannot be imported, is not
    a class, or does not subclass ``base``."""
    where = f"{field}.uses"
    dist = None
    if ":" in uses or "." in uses:
        module_name, _, attr = uses.partition(":") if ":" in uses else uses.rpartition(".")
    else:
        ep = _entry_point(uses, group, where)
        module_name, attr, dist = ep.module, ep.attr, ep.dist
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - boundary: the user's module, at import
        raise SpecError(f"{where}: {uses!r}: cannot import module {module_name!r}: "
                        f"{type(e).__name__}: {clip(str(e), 500)}", where, uses) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"{where}: {uses!r}: {getattr(obj, '__name__', module_name)!r} "
                            f"has no attribute {part!r}", where, uses)
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise SpecError(f"{where}: {uses!r} is {short_repr(obj)}, not a subclass of "
                        f"{base.__module__}.{base.__qualname__}", where, uses)
    name, version, sha = _origin(obj, dist)
    return Plugin(field, obj, name, version, sha, dict(settings))


def _entry_point(name: str, group: str, where: str) -> importlib.metadata.EntryPoint:
    """The entry point ``name`` of ``group``. Raises ``SpecError`` listing the group's
    names when there is none."""
    found = importlib.metadata.entry_points(group=group)
    if name in found.names:
        return found[name]
    known = ", ".join(sorted(found.names)) or "none installed"
    raise SpecError(f"{where}: {name!r} is no entry point of group {group!r} (installed: "
                    f"{known}); name a class as 'module:Class' or install the package that "
                    "registers it", where, name)


def _origin(cls: type, dist: importlib.metadata.Distribution | None
            ) -> tuple[str | None, str | None, str | None]:
    """``(distribution name, version, None)`` of the distribution that provides ``cls``'s
    module (``dist`` of its entry point, else ``packages_distributions()`` of its top-level
    package), or ``(None, None, sha256 of the defining file)`` when none does."""
    if dist is None:
        top = cls.__module__.partition(".")[0]
        names = set(importlib.metadata.packages_distributions().get(top, ()))
        dist = importlib.metadata.distribution(names.pop()) if len(names) == 1 else None
    if dist is not None:
        return dist.metadata["Name"], dist.version, None
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        path = None
    if path is None:
        return None, None, None
    with open(path, "rb") as f:
        return None, None, hashlib.sha256(f.read()).hexdigest()
