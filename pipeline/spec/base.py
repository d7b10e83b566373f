"""What every section of the job spec shares: ``_Strict``, the base of the sections
(``extra="forbid"``: an unknown field is an error; frozen), ``FieldNotApplicable`` (fields
that a spec's ``source.kind`` or another setting rules out), ``PluginSpec`` and the check of
its ``uses``, and the media extensions a source reads by default (``image_extensions()``,
``VIDEO_EXTENSIONS``, ``SIDECAR_EXTENSIONS``).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue

from pipeline.plugins import USES_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Containers FFmpeg (PyAV) opens that hold video.
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts",
                    ".m2ts", ".mts", ".flv", ".wmv", ".3gp", ".ogv")
SIDECAR_EXTENSIONS = (".txt", ".json")


#: HEIF/HEIC extensions pillow-heif's opener registers; listed statically so that listing
#: files imports no pillow-heif (the decoder registers it when a file sniffs as HEIF).
HEIF_EXTENSIONS = (".heic", ".heics", ".heif", ".heifs", ".hif")


#: Pillow formats ``pipeline.media.decode`` decodes (``imageio_util.RASTER_FORMATS`` |
#: ``EXTENSION_FORMATS``, plus MPO, which sniffs as JPEG); listed here because the spec
#: imports no media module (tests/media/test_decode_edges.py checks they agree). Pillow's
#: other openers (stubs: BUFR, GRIB, HDF5, WMF; EPS without Ghostscript; MPEG, IPTC, FITS,
#: FLI, FTEX, GBR, PCD, PIXAR: untested here; IM: deprecated, Pillow 15 drops it) give no default
#: extension.
DECODED_IMAGE_FORMATS = frozenset(
    {"JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP", "ICO", "CUR", "AVIF", "JPEG2000", "PSD",
     "QOI", "DDS", "ICNS", "PPM", "MPO", "TGA", "SGI", "PCX", "DCX", "BLP", "MSP", "XBM",
     "XPM", "DIB", "SUN"})


@functools.cache
def image_extensions() -> tuple[str, ...]:
    """Default image extensions: every extension Pillow registers an opener for
    (``PIL.Image.registered_extensions``, after ``Image.init()``) whose format the decoder
    handles (``DECODED_IMAGE_FORMATS``), plus pillow-heif's (``HEIF_EXTENSIONS``; without
    pillow-heif such a file becomes an ``unsupported_format`` row), plus ``.svg`` (read,
    then refused as ``unsupported_format``), minus the sidecar extensions; sorted. A file
    with one of these is read and decoded - a file that does not decode becomes an error
    row, never a silently skipped file."""
    from PIL import Image

    Image.init()
    found = {ext.lower() for ext, fmt in Image.registered_extensions().items()
             if fmt in Image.OPEN and fmt in DECODED_IMAGE_FORMATS}
    return tuple(sorted((found | set(HEIF_EXTENSIONS) | {".svg", ".mpo"})
                        - set(SIDECAR_EXTENSIONS)))


_USES_DOC = ("`module:Class`, `module.Class`, or the name of an entry point that an "
             "installed package registers under `mmpipe.{group}` (docs/extending.md). Its "
             "package must be installed where the workers run.")
_WITH_DOC = ("Keyword arguments of the class's constructor (JSON values); all of them, "
             "and the version of the package that provides the class, go into the "
             "fingerprint.")


def _check_uses(value: str | None) -> str | None:
    """`uses`: `module:Class`, `module.Class` or an entry point name (letters, digits,
    `_`, `-`); importing it is checked when the pipeline is assembled."""
    if value is not None and not USES_PATTERN.match(value):
        raise ValueError(f"{value!r} is not 'module:Class', 'module.Class' or an entry "
                         "point name")
    return value


Uses = Annotated[str, AfterValidator(_check_uses)]


class PluginSpec(BaseModel):
    """A class from the user's own package (`pipeline/plugins.py`): a step
    (`steps[]`, group `mmpipe.steps`) or a datasink (`sink.datasinks[]`, group
    `mmpipe.datasinks`), and its settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              serialize_by_alias=True)

    uses: Uses = Field(description="The class: " + _USES_DOC.format(group="steps` or "
                                                                  "`mmpipe.datasinks"))
    with_: dict[str, JsonValue] = Field({}, alias="with",
                                        description=_WITH_DOC)


class FieldNotApplicable(ValueError):
    """Fields a spec sets that its ``source.kind`` (or another setting) rules out.
    ``problems``: a list of ``(field, value, message)``, ``field`` relative to its section
    (``path_column``; from the root for a whole-spec rule);
    ``parse_spec`` reports each as ``<section>.<field>: <message>`` in a ``SpecError``."""

    def __init__(self, problems: list[tuple[str, Any, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{field}: {message}" for field, _, message in problems))
