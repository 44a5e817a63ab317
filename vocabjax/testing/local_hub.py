"""A Hugging Face Hub served on 127.0.0.1, for tests: the real `huggingface_hub` client
downloads from it (its cache, refs, resume, errors) with nothing leaving the machine.

    with LocalHub() as hub:
      sha = hub.add("org/tiny", {"config.json": b"{...}", "model.safetensors": data})
      load_model("org/tiny", hub_endpoint=hub.endpoint)   # or HF_ENDPOINT=hub.endpoint

What it serves, as the Hub does for huggingface_hub 2.x (the routes and headers its client
reads): model info (`/api/models/<repo>[/revision/<rev>]`, `?blobs=true` adds sizes and LFS
sha256), the file tree, and `/<repo>/resolve/<rev>/<path>` (HEAD and GET). Files under
`lfs_suffixes` are LFS files: their resolve answers a redirect to a second origin (`localhost`
for `127.0.0.1`, as the Hub redirects to its CDN) with `X-Linked-Etag` = their sha256; the CDN
honours `Range`. Errors carry the Hub's `X-Error-Code` (`RepoNotFound`, `GatedRepo`,
`RevisionNotFound`, `EntryNotFound`), which is all the client maps. Never an xet header: the
client then downloads over plain HTTP.

Faults for tests: `cut_next(n)` makes the next n CDN GETs announce the whole length, send half
the bytes and drop the connection; `corrupt = True` serves wrong bytes of the right length;
`requests` records (method, path, Range header, authorised)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_local_test_token"  # the token a gated repository accepts
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".npz", ".npy")


def git_blob_sha1(data: bytes) -> str:
  """git's object id of a file's bytes (the Hub's ETag of a non-LFS file)."""
  return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class LocalHub:
  """A Hub on 127.0.0.1:<free port> in a daemon thread (a context manager)."""

  def __init__(self, lfs_suffixes=LFS_SUFFIXES):
    self.lfs_suffixes = tuple(lfs_suffixes)
    self.repos: dict[str, dict] = {}
    self.requests: list[tuple] = []
    self.corrupt = False
    self._cuts = 0
    self._lock = threading.Lock()
    hub = self

    class Handler(_Handler):
      owner = hub

    self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.server.daemon_threads = True
    self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
    self._thread.start()

  @property
  def endpoint(self) -> str:
    return f"http://127.0.0.1:{self.server.server_port}"

  def add(self, repo_id: str, files: dict[str, bytes], *, revision: str = "main",
          gated: bool = False) -> str:
    """Publish `files` as `repo_id` at branch `revision` (a new commit); returns its sha."""
    entries = {}
    for path, data in files.items():
      e = {"data": bytes(data), "size": len(data), "oid": git_blob_sha1(data)}
      if path.endswith(self.lfs_suffixes):
        e["sha256"] = hashlib.sha256(data).hexdigest()
        pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{e['sha256']}\n"
                   f"size {len(data)}\n").encode()
        e["oid"], e["pointer_size"] = git_blob_sha1(pointer), len(pointer)
      entries[path] = e
    repo = self.repos.setdefault(repo_id, {"gated": gated, "commits": {}, "branches": {}})
    repo["gated"] = gated
    sha = hashlib.sha1(json.dumps([repo_id, revision, len(repo["commits"]),
                                   sorted((p, e["oid"]) for p, e in entries.items())]).encode()
                       ).hexdigest()
    repo["commits"][sha] = entries
    repo["branches"][revision] = sha
    return sha

  def cut_next(self, n: int = 1) -> None:
    """The next `n` GETs of an LFS file send half their bytes, then drop the connection."""
    with self._lock:
      self._cuts = n

  def _take_cut(self) -> bool:
    with self._lock:
      if self._cuts > 0:
        self._cuts -= 1
        return True
      return False

  def close(self) -> None:
    self.server.shutdown()
    self.server.server_close()

  def __enter__(self) -> "LocalHub":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _Handler(BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"  # keep-alive with Content-Length framing, as the Hub
  owner: LocalHub

  def log_message(self, *args):  # quiet
    pass

  def _send(self, status: int, body: bytes = b"", headers=None,
            ctype: str = "application/json") -> None:
    self.send_response(status)
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    self.send_header("Content-Type", ctype)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(body)

  def _error(self, status: int, code: str, message: str, extra=None) -> None:
    self._send(status, json.dumps({"error": message}).encode(),
               {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})})

  def _repo(self, repo_id: str):
    repo = self.owner.repos.get(repo_id)
    if repo is None:
      self._error(401, "RepoNotFound", "Repository not found")
      return None
    if repo["gated"]:
      auth = self.headers.get("Authorization")
      if auth is None:
        self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must "
                    f"have access to it and be authenticated to access it. Please log in.")
        return None
      if auth != f"Bearer {TOKEN}":
        self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are "
                    f"not in the authorized list.")
        return None
    return repo

  def _commit(self, repo: dict, rev: str):
    sha = repo["branches"].get(rev, rev if rev in repo["commits"] else None)
    if sha is None:
      self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
    return sha

  def do_HEAD(self):
    self.do_GET()

  def do_GET(self):
    self.owner.requests.append((self.command, self.path, self.headers.get("Range"),
                                self.headers.get("Authorization") is not None))
    url = urlsplit(self.path)
    path, query = unquote(url.path), parse_qs(url.query)
    if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/(.+?)(?:/.*)?", path):
      return self._tree(m[1], m[2])
    if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path):
      return self._info(m[1], m[2] or "main", query.get("blobs") == ["true"])
    if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
      return self._resolve(m[1], m[2], m[3])
    if m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
      return self._cdn(m[1])
    self._send(404, b'{"error": "not found"}')

  def _info(self, repo_id: str, rev: str, blobs: bool) -> None:
    if (repo := self._repo(repo_id)) is None or (sha := self._commit(repo, rev)) is None:
      return
    siblings = []
    for p, e in repo["commits"][sha].items():
      s = {"rfilename": p}
      if blobs:
        s.update(size=e["size"], blobId=e["oid"])
        if "sha256" in e:
          s["lfs"] = {"size": e["size"], "sha256": e["sha256"], "pointerSize": e["pointer_size"]}
      siblings.append(s)
    body = {"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
            "gated": "manual" if repo["gated"] else False, "disabled": False, "tags": [],
            "downloads": 0, "likes": 0, "lastModified": "2026-01-01T00:00:00.000Z",
            "createdAt": "2026-01-01T00:00:00.000Z", "siblings": siblings}
    self._send(200, json.dumps(body).encode())

  def _tree(self, repo_id: str, rev: str) -> None:
    if (repo := self._repo(repo_id)) is None or (sha := self._commit(repo, rev)) is None:
      return
    out = []
    for p, e in repo["commits"][sha].items():
      d = {"type": "file", "path": p, "size": e["size"], "oid": e["oid"]}
      if "sha256" in e:
        d["lfs"] = {"oid": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
      out.append(d)
    self._send(200, json.dumps(out).encode())

  def _resolve(self, repo_id: str, rev: str, filename: str) -> None:
    if (repo := self._repo(repo_id)) is None or (sha := self._commit(repo, rev)) is None:
      return
    e = repo["commits"][sha].get(filename)
    if e is None:
      return self._error(404, "EntryNotFound", f"{filename} does not exist on {rev!r}",
                         {"X-Repo-Commit": sha})
    h = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes", "ETag": f'"{e["oid"]}"'}
    if "sha256" in e:  # an LFS file: to the "CDN", another origin
      h.update({"X-Linked-Etag": f'"{e["sha256"]}"', "X-Linked-Size": str(e["size"]),
                "Location": f"http://localhost:{self.server.server_port}/cdn/{e['sha256']}"})
      return self._send(302, b"", h, ctype="text/plain")
    self._send(200, e["data"], h, ctype="application/octet-stream")

  def _cdn(self, sha256: str) -> None:
    data = next((e["data"] for r in self.owner.repos.values() for c in r["commits"].values()
                 for e in c.values() if e.get("sha256") == sha256), None)
    if data is None:
      return self._send(404, b"NoSuchKey", ctype="text/plain")
    if self.owner.corrupt:
      data = bytes(b ^ 0xFF for b in data)  # the right length, the wrong bytes
    total, start, end, status = len(data), 0, len(data) - 1, 200
    h = {"ETag": f'"{sha256}"', "Accept-Ranges": "bytes"}
    if rng := self.headers.get("Range"):
      m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
      if not m or int(m[1]) >= total:
        return self._send(416, b"", {"Content-Range": f"bytes */{total}"})
      start, end, status = int(m[1]), min(int(m[2]), total - 1) if m[2] else total - 1, 206
      h["Content-Range"] = f"bytes {start}-{end}/{total}"
    body = data[start:end + 1]
    if self.command == "GET" and self.owner._take_cut():
      self.send_response(status)
      for k, v in h.items():
        self.send_header(k, v)
      self.send_header("Content-Length", str(len(body)))  # the whole length announced...
      self.end_headers()
      self.wfile.write(body[:len(body) // 2])  # ...half sent, then the connection dropped
      self.wfile.flush()
      self.close_connection = True
      return
    self._send(status, body, h, ctype="application/octet-stream")
