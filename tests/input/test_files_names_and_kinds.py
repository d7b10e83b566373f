"""T3-19 and issue 12: a files input pairs media and sidecars after NFC normalisation, an
unpaired sidecar is reported as unpaired, and FIFOs, sockets and dangling links are counted
as not read by kind (never silently dropped)."""

from __future__ import annotations

import os
import shutil
import socket
import unicodedata

from tests.conftest import CASES, PHOTOS, coco_captions
from tests.input.local_job import run_job, unread

T3_19 = CASES / "T3-19_unicode_names" / "local"
PNG = (T3_19 / "naïve.png").read_bytes()


def _photo(i: int) -> bytes:
    return (PHOTOS / coco_captions()[i]["file"]).read_bytes()


def _nfd(s: str) -> str:
    return unicodedata.normalize("NFD", s)


def test_t3_19_nfd_image_pairs_with_nfc_caption_end_to_end(tmp_path):
    names = sorted(os.listdir(T3_19))
    assert _nfd("café.png") in names and "café.txt" in names  # the case as handed
    rows, plan = run_job({"kind": "files", "uri": str(T3_19)}, tmp_path / "out")
    got = {unicodedata.normalize("NFC", r["key"]): (r["status"], r["caption"]) for r in rows}
    assert got == {"café": ("ok", (T3_19 / "café.txt").read_text().strip()),
                   "naïve": ("ok", (T3_19 / "naïve.txt").read_text().strip())}
    assert unread(plan) == {}


def test_more_nfd_pairs_unpaired_sidecars_and_names_in_between(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / _nfd("über.jpg")).write_bytes(_photo(0))  # NFD media, NFC caption
    (src / "über.txt").write_text("uber")
    (src / "ñandú.jpg").write_bytes(_photo(1))  # NFC media, NFD caption
    (src / _nfd("ñandú.txt")).write_text("rhea")
    (src / "uberx.jpg").write_bytes(_photo(2))  # sorts between NFD and NFC über
    (src / "uberx.txt").write_text("x")
    (src / _nfd("éclair.txt")).write_text("alone")  # an NFD sidecar without media
    (src / "orphan.json").write_text("{}")
    rows, plan = run_job({"kind": "files", "uri": str(src)}, tmp_path / "out")
    got = {unicodedata.normalize("NFC", r["key"]): (r["status"], r["caption"]) for r in rows}
    assert got == {"über": ("ok", "uber"), "ñandú": ("ok", "rhea"), "uberx": ("ok", "x")}
    assert unread(plan) == {".txt (unpaired sidecar)": 1, ".json (unpaired sidecar)": 1}


def test_fifo_socket_and_dangling_link_are_counted_by_kind(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(T3_19 / "naïve.png", src / "a.png")
    os.mkfifo(src / "b.png")                        # would block a reader forever
    os.symlink(src / "missing.png", src / "c.png")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "d.png"))
    try:
        rows, plan = run_job({"kind": "files", "uri": str(src)}, tmp_path / "out")
    finally:
        sock.close()
    assert [(r["key"], r["status"]) for r in rows] == [("a", "ok")]
    assert unread(plan) == {"(fifo)": 1, "(dangling link)": 1, "(socket)": 1}
    assert plan.totals()["unread"] == 3
