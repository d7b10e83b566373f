"""Copies of the bundled photos for dataset-wide dedup tests.

``byte_copies``: 12 byte-identical copies of each photo, named so that the copies of one
photo fall in different partitions (``c00-<stem>.jpg`` ... ``c11-<stem>.jpg`` sort copy by
copy). ``near_copies``: per photo the original, a byte copy, re-encodes at JPEG quality 60,
75 and 90, and 2% and 4% border crops (re-encoded at quality 90): 7 files each. Pillow does
every re-encode. Both take the photos to copy (default: all 57; the end-to-end passes use
``SOME``, 16 of them: the claims are per photo, and the pass costs per file).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from PIL import Image

from tests.conftest import REPO

PHOTOS = sorted((REPO / "data" / "photos").glob("*.jpg"))
QUALITIES = (60, 75, 90)
CROPS = (0.02, 0.04)
SOME = PHOTOS[:16]


def byte_copies(root: Path, copies: int = 12, photos: list[Path] = PHOTOS) -> Path:
    """``copies`` byte-identical copies of each of ``photos`` under ``root``; returns
    ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for c in range(copies):
        for p in photos:
            shutil.copyfile(p, root / f"c{c:02d}-{p.stem}.jpg")
    return root


def _jpeg(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def near_copies(root: Path, photos: list[Path] = PHOTOS) -> Path:
    """Per photo of ``photos``: ``c00`` original, ``c01`` byte copy, ``q60``/``q75``/``q90``
    re-encodes, ``k02``/``k04`` border crops; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for p in photos:
        shutil.copyfile(p, root / f"c00-{p.stem}.jpg")
        shutil.copyfile(p, root / f"c01-{p.stem}.jpg")
        with Image.open(p) as img:
            img = img.convert("RGB")
            for q in QUALITIES:
                (root / f"q{q:02d}-{p.stem}.jpg").write_bytes(_jpeg(img, q))
            for frac in CROPS:
                dx, dy = int(img.width * frac), int(img.height * frac)
                crop = img.crop((dx, dy, img.width - dx, img.height - dy))
                (root / f"k{int(frac * 100):02d}-{p.stem}.jpg").write_bytes(_jpeg(crop, 90))
    return root


def stem(key: str) -> str:
    """The photo a copy's key came from (``c03-000000000790`` -> ``000000000790``)."""
    return key.split("-", 1)[1]
