"""A registry of npm packages on loopback, for `cellblock install` without the network.

`npm_registry({"name": {"package.json": ..., "file": ...}})` serves each package at version
1.0.0 (the version its package.json names) the way registry.npmjs.org does: its metadata at
`/NAME` and its tarball beside it. Point `npm_config_registry` at the URL it yields: the
installer's egress proxy then allows exactly that address (an IP rule), as for a registry mirror.
With `upstream` (a registry's URL) it is such a mirror, as a company runs one: any other package
is fetched from there, its tarballs served through the mirror too.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["npm_registry", "tarball"]


def npm_package(name: str, postinstall: str, **files: str) -> dict[str, str]:
    """The files of npm package `name`@1.0.0 with a program (`index.js`, unless `files` gives one)
    and a `postinstall` script, and `files` beside them."""
    manifest = {"name": name, "version": "1.0.0", "bin": {name: "index.js"}, "scripts": {"postinstall": postinstall}}
    return {"package.json": json.dumps(manifest), "index.js": "#!/usr/bin/env node\n", **files}


def tarball(files: Mapping[str, str]) -> bytes:
    """A package's .tgz as npm packs it: every file under `package/`, executable."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@contextmanager
def npm_registry(packages: Mapping[str, Mapping[str, str]], upstream: str | None = None) -> Iterator[str]:
    """Serve `packages` (name -> file name -> text, with a package.json) on 127.0.0.1, and every other
    package from `upstream` when given; yields its URL."""
    blobs = {name: tarball(files) for name, files in packages.items()}
    manifests = {name: json.loads(files["package.json"]) for name, files in packages.items()}

    class Registry(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            name = self.path.strip("/").split("/-/")[0]
            if name not in manifests:
                self._forward() if upstream else self.send_error(404)
                return
            manifest = manifests[name]
            if "/-/" in self.path:
                self._send(blobs[name], "application/octet-stream")
                return
            port = self.server.server_address[1]
            version = {
                **manifest,
                "dist": {
                    "tarball": f"http://127.0.0.1:{port}/{name}/-/{name}-{manifest['version']}.tgz",
                    "shasum": hashlib.sha1(blobs[name]).hexdigest(),  # npm's own checksum
                },
            }
            latest = manifest["version"]
            document = {"name": name, "dist-tags": {"latest": latest}, "versions": {latest: version}}
            self._send(json.dumps(document).encode(), "application/json")

        def _forward(self) -> None:
            assert upstream is not None
            request = urllib.request.Request(
                upstream.rstrip("/") + self.path, headers={"Accept": self.headers["Accept"] or "*/*"}
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as answer:
                    body, kind = answer.read(), answer.headers.get("Content-Type", "application/octet-stream")
            except urllib.error.HTTPError as exc:
                self.send_error(exc.code)
                return
            if "json" in kind:  # its tarballs through here too: the installer reaches this mirror alone
                port = self.server.server_address[1]
                body = body.replace(upstream.rstrip("/").encode() + b"/", f"http://127.0.0.1:{port}/".encode())
            self._send(body, kind)

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
