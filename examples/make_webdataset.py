"""Build WebDataset shards from the 57 bundled photos, to try WebDataset input:

    .venv/bin/python examples/make_webdataset.py /tmp/shards            # 6 shards
    .venv/bin/mmpipe run examples/webdataset.yaml --address local --input /tmp/shards \
        --output output/webdataset-photos

Each sample is two members, in this order: ``<key>.jpg`` (the photo's bytes as bundled) and
``<key>.json`` (``{"caption": <the first of its five COCO captions>, "license": ...,
"license_url": ..., "flickr_url": ..., "width": ..., "height": ...}``), key = the COCO id
(``000000397133``). ``--samples-per-shard`` samples go into each shard
``shard-000000.tar``, ``shard-000001.tar``, ... (plain uncompressed tar, stdlib
``tarfile``, deterministic headers: mtime 0, uid/gid 0, mode 0444, so the same input gives
byte-identical shards). ``--copies K`` repeats the photo set K times (keys
``<id>_c<k>`` for copies after the first) - bigger inputs for benchmarks; the copies have
identical bytes, so turn dedup off (``--set dedup.exact=false --set dedup.near=false``)
if every copy should come out ``ok``.

The directory is created if needed; existing ``shard-*.tar`` files in it are replaced
(other files are left alone).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHOTOS = REPO / "data" / "photos"


def photo_samples(photos: Path = PHOTOS) -> list[tuple[str, bytes, dict]]:
    """``(key, jpeg bytes, json metadata)`` for every photo in ``captions.jsonl``, in order."""
    samples = []
    for line in (photos / "captions.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        meta = {"caption": rec["captions"][0], "license": rec.get("license"),
                "license_url": rec.get("license_url"), "flickr_url": rec.get("flickr_url"),
                "width": rec.get("width"), "height": rec.get("height")}
        samples.append((rec["key"], (photos / rec["file"]).read_bytes(), meta))
    return samples


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o444, 0, 0, "", ""
    tf.addfile(info, io.BytesIO(data))


def make_shards(out_dir: str | Path, samples_per_shard: int = 10, copies: int = 1,
                photos: Path = PHOTOS) -> list[Path]:
    """Write the shards into ``out_dir``; return their paths."""
    if samples_per_shard < 1 or copies < 1:
        raise ValueError("samples_per_shard and copies must be >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("shard-*.tar"):
        old.unlink()
    base = photo_samples(photos)
    samples = [(key if c == 0 else f"{key}_c{c}", data, meta)
               for c in range(copies) for key, data, meta in base]
    paths = []
    for n, start in enumerate(range(0, len(samples), samples_per_shard)):
        path = out / f"shard-{n:06d}.tar"
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
            for key, data, meta in samples[start:start + samples_per_shard]:
                _add(tf, f"{key}.jpg", data)
                _add(tf, f"{key}.json", json.dumps(meta, ensure_ascii=False).encode())
        tmp.replace(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", help="directory for the shards (created if needed)")
    p.add_argument("--samples-per-shard", type=int, default=10, help="samples per shard (10)")
    p.add_argument("--copies", type=int, default=1, help="repeat the 57 photos K times (1)")
    args = p.parse_args(argv)
    paths = make_shards(args.out_dir, args.samples_per_shard, args.copies)
    n = sum(1 for line in (PHOTOS / "captions.jsonl").read_text().splitlines()
            if line.strip()) * args.copies
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} shards ({n} samples, {size / 2**20:.1f} MiB) to {args.out_dir}")
    print(f"try: .venv/bin/mmpipe run examples/webdataset.yaml --address local "
          f"--input {args.out_dir} --output output/webdataset-photos")
    return 0


if __name__ == "__main__":
    sys.exit(main())
