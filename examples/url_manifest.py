"""An img2dataset-style URL manifest end to end, on the bundled photos, all on 127.0.0.1:

    .venv/bin/python examples/url_manifest.py            (after `make install`)

1. Starts a stdlib ``http.server.ThreadingHTTPServer`` on 127.0.0.1 (a free port) that
   serves ``data/photos/*.jpg`` under ``/photos/`` plus three bad routes:
   ``/missing.jpg`` (HTTP 404), ``/noai.jpg`` (a real JPEG, but the response carries
   ``X-Robots-Tag: noai``, so it must not be downloaded) and ``/page.jpg`` (HTTP 200 with
   an HTML page instead of an image: what a CDN's "image not found" page looks like).
2. Writes a Parquet manifest with ``url`` and ``caption`` columns (the 57 photos with
   their first COCO caption, then the three bad URLs) into a temporary directory.
3. Runs ``mmpipe run examples/url_manifest.yaml --input <manifest> --address local
   --mode overwrite`` (a fresh local Ray) and prints the job report.
4. Reads the committed output back and prints status and error of the bad rows. Exits 1
   if anything is not as expected: 57 ok, and the three bad URLs as error rows
   (``failed_to_download`` HTTP 404, ``failed_to_download`` opted out by X-Robots-Tag,
   ``not_an_image``), with every input row present exactly once.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
PHOTOS = REPO / "data" / "photos"
SPEC = REPO / "examples" / "url_manifest.yaml"
HTML = (b"<!DOCTYPE html>\n<html><head><title>Not found</title></head>"
        b"<body><p>This image is no longer available.</p></body></html>\n")
NOAI_PHOTO = "000000397133.jpg"   # what /noai.jpg would serve if it were downloaded

# url path -> (what the row must become: status, error prefix)
BAD_ROUTES = {
    "/missing.jpg": ("error", "failed_to_download", "HTTP 404"),
    "/noai.jpg": ("error", "failed_to_download", "opted out by X-Robots-Tag: noai"),
    "/page.jpg": ("error", "not_an_image", "HTML"),
}


class Handler(http.server.BaseHTTPRequestHandler):
    """Photos under /photos/<file>, plus the bad routes of ``BAD_ROUTES``."""

    protocol_version = "HTTP/1.1"
    requests_seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        Handler.requests_seen.append(self.path)
        if self.path.startswith("/photos/"):
            path = PHOTOS / os.path.basename(self.path)
            if path.suffix == ".jpg" and path.is_file():
                return self._send(200, path.read_bytes(), "image/jpeg")
        elif self.path == "/noai.jpg":
            return self._send(200, (PHOTOS / NOAI_PHOTO).read_bytes(), "image/jpeg",
                              {"X-Robots-Tag": "noai"})
        elif self.path == "/page.jpg":
            return self._send(200, HTML, "text/html; charset=utf-8")
        self._send(404, b"not found\n", "text/plain")

    def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # quiet
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A client that stops reading (an opted-out /noai.jpg: the body is never read, the
        # connection is dropped) resets the connection: expected, not worth a traceback.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


def write_manifest(path: Path, base_url: str) -> pa.Table:
    """The manifest: 57 photo URLs with their first caption, then the bad URLs."""
    urls, captions = [], []
    for line in (PHOTOS / "captions.jsonl").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            urls.append(f"{base_url}/photos/{rec['file']}")
            captions.append(rec["captions"][0])
    for route in BAD_ROUTES:
        urls.append(base_url + route)
        captions.append(f"bad url {route}")
    table = pa.table({"url": urls, "caption": captions})
    pq.write_table(table, path)
    return table


def read_output(output: str) -> pa.Table:
    """The committed data rows (only files named by commit markers)."""
    sys.path.insert(0, str(REPO))
    from pipeline.read import read_committed

    return read_committed(output, columns=["key", "source_uri", "status", "reject_reason",
                                           "error", "caption"])


def check(out: pa.Table, manifest: pa.Table, base_url: str) -> list[str]:
    """What is not as expected (empty: all good)."""
    problems = []
    rows = out.to_pylist()
    by_url: dict[str, list[dict]] = {}
    for r in rows:
        by_url.setdefault(r["source_uri"], []).append(r)
    for url in manifest.column("url").to_pylist():
        if len(by_url.get(url, [])) != 1:
            problems.append(f"{url}: {len(by_url.get(url, []))} output rows, expected 1")
    if len(rows) != manifest.num_rows:
        problems.append(f"{len(rows)} output rows for {manifest.num_rows} manifest rows")
    for url, (status, reason, text) in BAD_ROUTES.items():
        for r in by_url.get(base_url + url, []):
            err = r["error"] or ""
            if r["status"] != status or not err.startswith(reason + ":") or text not in err:
                problems.append(f"{url}: got status={r['status']} error={err!r}, expected "
                                f"{status} '{reason}: ...{text}...'")
    photos = [r for u, rs in by_url.items() if "/photos/" in u for r in rs]
    bad = [r for r in photos if r["status"] != "ok"]
    for r in bad:
        problems.append(f"{r['source_uri']}: status {r['status']} "
                        f"{r['reject_reason'] or r['error']}, expected ok")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default="output/url_manifest",
                   help="job output (default output/url_manifest, git-ignored)")
    args = p.parse_args(argv)

    server = Server(("127.0.0.1", 0), Handler)
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    try:
        with tempfile.TemporaryDirectory(prefix="mmpipe-urls-") as tmp:
            manifest_path = Path(tmp) / "urls.parquet"
            manifest = write_manifest(manifest_path, base_url)
            print(f"serving {PHOTOS.relative_to(REPO)} at {base_url}; manifest "
                  f"{manifest_path} ({manifest.num_rows} rows: 57 photos + "
                  f"{len(BAD_ROUTES)} bad URLs)", flush=True)
            report_path = Path(tmp) / "report.json"
            cmd = [sys.executable, "-m", "pipeline", "run", str(SPEC), "--input",
                   str(manifest_path), "--output", args.output, "--address", "local",
                   "--mode", "overwrite", "--report-json", str(report_path),
                   # the local server is on loopback, which downloads refuse by default
                   "--set", "download.allow_networks=[127.0.0.0/8]"]
            env = dict(os.environ, HF_HUB_OFFLINE="1", NO_PROXY="127.0.0.1,localhost",
                       no_proxy="127.0.0.1,localhost")
            run = subprocess.run(cmd, cwd=REPO, env=env)
            if run.returncode != 0:
                print(f"mmpipe run exited {run.returncode}", file=sys.stderr)
                return 1
            report = json.loads(report_path.read_text())
        out = read_output(args.output)
    finally:
        server.shutdown()
        server.server_close()

    print(f"\nrequests served: {len(Handler.requests_seen)} "
          f"({sum(1 for r in Handler.requests_seen if r.startswith('/photos/'))} photos)")
    print("bad URLs:")
    rows = {r["source_uri"]: r for r in out.to_pylist()}
    for route in BAD_ROUTES:
        r = rows.get(base_url + route)
        if r is None:
            print(f"  {route:14s} MISSING from the output")
        else:
            print(f"  {route:14s} key={r['key']} status={r['status']} error={r['error']}")
    problems = check(out, manifest, base_url)
    if not report.get("complete"):
        problems.append(f"job not complete: failed partitions {report.get('partitions_failed')}")
    counts = report.get("rows_by_status", {})
    print(f"rows by status: {counts}; by reason: {report.get('rows_by_reason')}")
    if problems:
        print("UNEXPECTED:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    print("OK: 57 photos ok, every bad URL an error row with the expected reason")
    return 0


if __name__ == "__main__":
    sys.exit(main())
