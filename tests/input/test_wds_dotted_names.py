"""WebDataset names with dots, by the library's own rule: a member's key ends at the first
``.`` of its base name, its extension is the rest, and a member is media when the last part
of that extension is a media extension. A sample with two media members gives two rows
(none is lost); a ``.`` in a folder part of a key is written back unchanged."""

from __future__ import annotations

import json

import webdataset as wds

from pipeline.output.sinks.webdataset import WebDatasetWriter
from tests.conftest import PHOTOS, coco_captions
from tests.input.local_job import run_job
from tests.input.test_webdataset import _make_tar


def test_dotted_member_names_are_media_and_two_images_of_a_sample_are_two_rows(tmp_path):
    rows = coco_captions()[:5]
    photo = [(PHOTOS / r["file"]).read_bytes() for r in rows]
    src = tmp_path / "in"
    src.mkdir()
    _make_tar(src / "shard-000000.tar", [
        ("0003", {"left.png": photo[0], "right.png": photo[1], "txt": b"a stereo pair"}),
        ("a", {"b.c.jpg": photo[2], "txt": b"multi-part extension"}),
        ("photo 2024", {"01.05.jpg": photo[3]}),
        ("dir.v2/0004", {"jpg": photo[4], "txt": b"a dot in a folder part"}),
        ("0005", {"txt": b"text only", "json": b"{}"}),
    ])
    out = tmp_path / "out"
    got, _ = run_job({"kind": "webdataset", "uri": str(src)}, out,
                     sink={"uri": str(out), "webdataset": {"enabled": True}})
    by_key = {r["key"]: r for r in got}
    assert sorted(by_key) == ["0003%2Eleft%2Epng", "0003%2Eright%2Epng", "0005", "a",
                              "dir.v2/0004", "photo 2024"], sorted(by_key)
    ok = {k for k, r in by_key.items() if r["status"] == "ok"}
    assert ok == set(by_key) - {"0005"}, {k: r["error"] for k, r in by_key.items()}
    assert by_key["0003%2Eleft%2Epng"]["source_uri"].endswith("shard-000000.tar#0003.left.png")
    assert by_key["0003%2Eright%2Epng"]["caption"] == "a stereo pair"
    assert by_key["a"]["source_uri"].endswith("#a.b.c.jpg")
    assert (by_key["0003%2Eleft%2Epng"]["width"], by_key["0003%2Eright%2Epng"]["width"]) != \
        (None, None)
    # the text-only sample: an error row that names what it has and what would be media
    error = by_key["0005"]["error"]
    assert by_key["0005"]["status"] == "error" and "no media member (members: ['json', "\
        "'txt']; media extensions: [" in error and "'png'" in error, error

    # the WebDataset output, read by the webdataset library: the folder part keeps its dot
    shards = sorted(str(p) for p in (out / "wds").rglob("*.tar"))
    samples = {s["__key__"]: s for s in wds.WebDataset(shards, shardshuffle=False)}
    assert "dir.v2/0004" in samples and "dir_v2/0004" not in samples, sorted(samples)
    assert json.loads(samples["dir.v2/0004"]["json"])["key"] == "dir.v2/0004"
    assert len(samples) == 5 and "jpg" in samples["0003%2Eleft%2Epng"]


def test_member_key_escapes_dots_of_the_base_name_only():
    assert WebDatasetWriter.member_key("dir.v2/0004") == "dir.v2/0004"
    assert WebDatasetWriter.member_key("a.b/c.d") == "a.b/c_d"
    assert WebDatasetWriter.member_key("k.v1") == "k_v1"
