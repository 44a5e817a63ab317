"""Hub ids wherever a model, a head or a file is named: `org/name[@revision][/path]`.

A name that is not a local path (nor, for models, a registry name) but reads as a hub id is
fetched through `huggingface_hub` (its cache, `HF_TOKEN`, `HF_HUB_OFFLINE`, `HF_ENDPOINT`,
`HF_HUB_CACHE` / `HF_HOME`, read at each call), and only the files that are loaded: for
`kind="model"` config, generation config, tokenizer files and safetensors weights (or the sharded
index and its shards); `"eagle"` config.json and model.safetensors (or pytorch_model.bin);
`"medusa"` config.json and medusa_lm_head.safetensors (or .pt); `"file"` (or an id with a
`/path`) that file; `"folder"` (a distilled drafter) every file under it. Pickled `.bin` / `.pt`
weights are refused unless allowed (`allow_bin=True`, `--allow-bin`, `VOCABJAX_ALLOW_BIN=1`),
then read with `torch.load(weights_only=True)`.

Whatever can fail before a download fails before one, in one line naming the id (unknown or
gated repository, missing revision, no loadable weights, missing shards, too little disk). All
files come from one commit; a cut download resumes; each new file is checked against the hub's
hash (LFS sha256 or git blob id) and deleted on a mismatch. Offline, the id is answered from the
cache or refused naming what is missing (docs/published_heads.md, 'Naming models, heads and
files')."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path, PurePosixPath
from typing import Callable
from urllib.parse import unquote

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.errors import clip
from vocabjax.io import atomic_write_text

KINDS = ("model", "eagle", "medusa", "file", "folder")
CONFIG_FILES = ("config.json",)
MODEL_EXTRAS = ("generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
                "added_tokens.json", "chat_template.jinja", "chat_template.json")
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_ID = re.compile(rf"(?:hf://)?(?P<repo>{_SEGMENT}/{_SEGMENT})(?:@(?P<rev>[A-Za-z0-9_.%-]+))?"
                 r"(?P<path>(?:/[^/]+)*)/?")


# a revision after %-decoding: a branch or tag (parts may be separated by "/", as in refs/pr/1)
# or a commit id; no part empty or dot-led, so refs/<revision> stays inside the cache's refs/
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class HubError(CheckpointError):
  """A hub id that cannot be loaded; the message is one line naming the id and what to do."""


@dataclasses.dataclass(frozen=True)
class HubId:
  repo: str  # "org/name"
  revision: str = "main"  # a branch, tag or commit sha ("refs/pr/1" written refs%2Fpr%2F1)
  path: str = ""  # a file or folder inside the repository

  def __str__(self) -> str:
    rev = "" if self.revision == "main" else f"@{self.revision}"
    return f"{self.repo}{rev}{'/' + self.path if self.path else ''}"


def parse_hub_id(text) -> HubId | None:
  """The hub id `text` reads as (`org/name[@revision][/path]`, optionally `hf://`), or None."""
  s = str(text)
  m = _ID.fullmatch(s)
  if not m or ".." in m["repo"] or (not s.startswith("hf://") and s.startswith((".", "/", "~"))):
    return None
  path = m["path"].strip("/")
  if any(part in ("", ".", "..") for part in path.split("/")) and path:
    return None
  long = [part for part in m["repo"].split("/") if len(part) > 96]
  if long:
    raise HubError(f"{s[:80]}...: not a hub id: an organization or repository name has at most "
                   f"96 characters, this one {len(long[0])}")
  revision = unquote(m["rev"]) if m["rev"] else "main"
  if not _REVISION.fullmatch(revision) or len(revision) > 255:
    raise HubError(f"{s}: the revision {revision!r} is not a branch, tag or commit name (parts "
                   f"of letters, digits and _.- separated by /, none empty or starting with "
                   f"'.'; at most 255 characters)")
  return HubId(m["repo"], revision, path)


class PickleRefused(HubError):
  """Pickled weights refused (`bin_refusal`): allowing them is the remedy, not a download."""


_ALLOW_BIN: contextvars.ContextVar = contextvars.ContextVar("vocabjax_allow_bin", default=None)


@contextlib.contextmanager
def _scoped(var: contextvars.ContextVar, value: bool | None):
  """Within: `var` holds `value` (None: no change)."""
  token = var.set(bool(value)) if value is not None else None
  try:
    yield
  finally:
    if token is not None:
      var.reset(token)


def allowing_bin(allow_bin: bool | None):
  """Within: `allow_bin` (None: no change) is the default of every load that takes none (the
  heads, rankers and files a method builds from: `Method.make(..., allow_bin=True)`)."""
  return _scoped(_ALLOW_BIN, allow_bin)


def allow_bin_default(allow_bin: bool | None = None) -> bool:
  """`allow_bin` if given, else the innermost `allowing_bin`'s, else the environment's
  `VOCABJAX_ALLOW_BIN`."""
  if allow_bin is not None:
    return bool(allow_bin)
  if _ALLOW_BIN.get() is not None:
    return bool(_ALLOW_BIN.get())
  return os.environ.get("VOCABJAX_ALLOW_BIN", "").strip().lower() in ("1", "true", "yes")


_PROGRESS: contextvars.ContextVar = contextvars.ContextVar("vocabjax_progress", default=None)


def showing_progress(progress: bool | None):
  """Within: `progress` (None: no change) is the default of every load that takes none: the
  downloads' and checksums' bars of models, heads, rankers and files (`--quiet` of the
  commands, `progress=False` of `load_model` and `METHODS[name].make`)."""
  return _scoped(_PROGRESS, progress)


def progress_default(progress: bool | None = None) -> bool:
  """`progress` if given, else the innermost `showing_progress`'s, else True."""
  if progress is not None:
    return bool(progress)
  return True if _PROGRESS.get() is None else bool(_PROGRESS.get())


def _silent_tqdm():
  """A tqdm class that draws nothing (huggingface_hub's `tqdm_class` when progress is off)."""
  from tqdm.auto import tqdm

  class Silent(tqdm):
    def __init__(self, *args, **kwargs):
      kwargs["disable"] = True
      super().__init__(*args, **kwargs)

  return Silent


def bin_refusal(what: str, files) -> str:
  return (f"{what} has only pickled PyTorch weights ({', '.join(sorted(files))}); pickles can "
          f"run code when read, so they are refused unless allowed: pass --allow-bin (Python: "
          f"allow_bin=True to load_model or METHODS[name].make, or VOCABJAX_ALLOW_BIN=1) to "
          f"read them with torch.load(weights_only=True)")


def add_allow_bin_argument(parser) -> None:
  """The commands' `--allow-bin` flag (`allow_bin_from_args` applies it)."""
  parser.add_argument("--allow-bin", action="store_true",
                      help="read pickled PyTorch weights (pytorch_model.bin, medusa_lm_head.pt) "
                           "where a model or head has no safetensors, with torch.load("
                           "weights_only=True); refused by default (VOCABJAX_ALLOW_BIN=1 too)")


def allow_bin_from_args(args) -> None:
  """`--allow-bin` for everything this process (and its children) loads."""
  if getattr(args, "allow_bin", False):
    os.environ["VOCABJAX_ALLOW_BIN"] = "1"


# --- which files each kind loads ----------------------------------------------------------------

def _weights(names: set[str], prefix: str, stems: tuple[str, ...], allow_bin: bool, what: str
             ) -> list[str]:
  """The weight files among `names` for one of `stems` (safetensors first, then pickles)."""
  for stem in stems:
    for name in (f"{prefix}{stem}.safetensors.index.json", f"{prefix}{stem}.safetensors"):
      if name in names:
        return [name]  # an index: + its shards, once the index is read
  pickles = [f"{prefix}{stem}{ext}" for stem in stems for ext in (".bin", ".pt", ".bin.index.json")
             if f"{prefix}{stem}{ext}" in names]
  if pickles and not allow_bin:
    raise PickleRefused(bin_refusal(what, pickles))
  if pickles:
    return pickles[:1]
  listed = sorted(n for n in names if n.startswith(prefix))
  raise HubError(f"{what}: no loadable weights ({' or '.join(s + '.safetensors' for s in stems)}"
                 f"; found {listed[:12]}{' ...' if len(listed) > 12 else ''})")


def select_files(kind: str, names: set[str], prefix: str, allow_bin: bool, what: str
                 ) -> list[str]:
  """The files of a repository listing `names` (under `prefix`, "" or "dir/") that `kind`
  loads; HubError when something it needs is missing."""
  if kind not in KINDS:
    raise ValueError(f"unknown hub kind {kind!r}; choose one of {KINDS}")
  if kind == "file":
    return []
  if kind == "folder":
    files = sorted(n for n in names if n.startswith(prefix))
    pickles = [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl"))]
    if pickles and not allow_bin:
      raise PickleRefused(bin_refusal(what, pickles))
    return files
  if f"{prefix}config.json" not in names:
    raise HubError(f"{what}: no {prefix}config.json in the repository")
  out = [f"{prefix}config.json"]
  if kind == "model":
    out += [f"{prefix}{f}" for f in MODEL_EXTRAS if f"{prefix}{f}" in names]
  stems = ("medusa_lm_head",) if kind == "medusa" else ("model", "pytorch_model")
  return out + _weights(names, prefix, stems, allow_bin, what)


def shards_of(index_path: Path, names: set[str], prefix: str, what: str) -> list[str]:
  """The shard files a sharded index names, each refused unless it is a file of the
  repository beside the index (no `..`, no absolute path)."""
  try:
    weight_map = json.loads(index_path.read_text())["weight_map"]
    shards = sorted(set(weight_map.values()))
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise HubError(f"{what}: malformed sharded index {index_path.name} ({e})") from None
  bad = [s for s in shards if not isinstance(s, str) or PurePosixPath(s).is_absolute()
         or ".." in PurePosixPath(s).parts or f"{prefix}{s}" not in names]
  if bad:
    raise HubError(f"{what}: {index_path.name} names shard(s) that are not files of the "
                   f"repository beside it: {bad[:5]}")
  return [f"{prefix}{s}" for s in shards]


# --- the client, read at each call -------------------------------------------------------------

def endpoint() -> str:
  from huggingface_hub import constants

  return os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT


def cache_dir() -> Path:
  from huggingface_hub import constants

  if os.environ.get("HF_HUB_CACHE"):
    return Path(os.environ["HF_HUB_CACHE"]).expanduser()
  if os.environ.get("HF_HOME"):
    return Path(os.environ["HF_HOME"]).expanduser() / "hub"
  return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
  """The client's offline mode (`HF_HUB_OFFLINE`, which huggingface_hub reads when imported)."""
  from huggingface_hub import is_offline_mode

  return bool(is_offline_mode())


def _repo_folder(repo: str) -> Path:
  return cache_dir() / ("models--" + repo.replace("/", "--"))


def _cached_commit(hid: HubId) -> str | None:
  """The commit the cache records for the id's revision (None: not cached); a ref file that
  does not hold a commit id is refused (its content would name a snapshot path)."""
  folder = _repo_folder(hid.repo)
  if _COMMIT.fullmatch(hid.revision) and (folder / "snapshots" / hid.revision).is_dir():
    return hid.revision
  ref = folder / "refs" / hid.revision
  if not ref.is_file():
    return None
  commit = ref.read_text().strip()
  if not _COMMIT.fullmatch(commit):
    raise HubError(f"{hid}: the cache's ref {ref} does not hold a commit id (40 hex digits; it "
                   f"holds {len(commit)} characters): delete it and download the revision again")
  return commit


def _listing(snapshot: Path) -> set[str]:
  return {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()}


def _one_line(e: BaseException) -> str:
  return clip(str(e))


def _info(hid: HubId, token):
  from huggingface_hub import HfApi
  from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                      RepositoryNotFoundError, RevisionNotFoundError)

  ep = endpoint()
  try:
    return HfApi(endpoint=ep).model_info(hid.repo, revision=hid.revision, files_metadata=True,
                                         token=token)
  except GatedRepoError:
    if token:
      raise HubError(f"{hid}: {hid.repo} is gated and the token in HF_TOKEN has no access to "
                     f"it: accept its terms at {ep}/{hid.repo} with that account") from None
    raise HubError(f"{hid}: {hid.repo} is gated: accept its terms at {ep}/{hid.repo}, then set "
                   f"HF_TOKEN to a token of that account (or run `hf auth login`)") from None
  except RepositoryNotFoundError:
    raise HubError(f"{hid}: no repository {hid.repo} on {ep} (not a local path either; a "
                   f"private repository needs HF_TOKEN)") from None
  except RevisionNotFoundError:
    raise HubError(f"{hid}: {hid.repo} has no revision {hid.revision!r} (a branch, tag or "
                   f"commit sha)") from None
  except OfflineModeIsEnabled:
    raise HubError(f"{hid}: offline (HF_HUB_OFFLINE) and not in the cache") from None
  except (HfHubHTTPError, OSError, *_client_errors()) as e:  # refused, DNS, timeout, a 5xx
    raise HubError(f"{hid}: cannot reach {ep} ({type(e).__name__}: {_one_line(e)}); with the "
                   f"files in the cache, HF_HUB_OFFLINE=1 loads them from there") from None


def _client_errors() -> tuple[type, ...]:
  """The hub client's HTTP library's own errors (huggingface_hub 1.x: httpx, 2.x: httpx2;
  not OSErrors: a refused connection, a timeout, a bad URL). Older clients used requests,
  whose errors are OSErrors."""
  import importlib

  out = []
  for name in ("httpx2", "httpx"):
    try:
      mod = importlib.import_module(name)
    except ImportError:
      continue
    out += [getattr(mod, e) for e in ("HTTPError", "InvalidURL") if hasattr(mod, e)]
  return tuple(out)


def _verify(path: Path, sibling) -> str | None:
  """Why the downloaded `path` is not the hub's file `sibling` (None: it is)."""
  lfs = getattr(sibling, "lfs", None)
  data_hash = (lfs.sha256 if lfs is not None else getattr(sibling, "blob_id", None))
  size = lfs.size if lfs is not None else getattr(sibling, "size", None)
  if size is not None and path.stat().st_size != size:
    return f"{path.stat().st_size:,} bytes, the hub says {size:,}"
  if not data_hash:
    return None
  digest = _file_hash(path, lfs=lfs is not None)
  if digest != data_hash:
    return f"its bytes hash to {digest[:16]}..., the hub's file to {data_hash[:16]}..."
  return None


def _file_hash(path: Path, *, lfs: bool) -> str:
  """The hub's id of a file's bytes: its sha256 (an LFS file) or its git blob id (the sha1 of
  "blob <size>\\0" and the bytes)."""
  if lfs:
    h = hashlib.sha256()
  else:
    h = hashlib.sha1()
    h.update(b"blob %d\0" % path.stat().st_size)
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      h.update(chunk)
  return h.hexdigest()


_VERIFIED: dict = {}  # blob path -> (size, mtime_ns) when this process checked its bytes


def _stamp(path: Path) -> tuple[int, int]:
  st = path.stat()
  return st.st_size, st.st_mtime_ns


def check_cached(hid: HubId, local: Path, name: str) -> None:
  """A cached file's bytes against its blob's name, which huggingface_hub's cache makes the
  file's sha256 (LFS files) or its git blob id (the others): a file changed since it was
  downloaded (bit rot, a bad copy) is refused, naming it and what to do. Checked the first time
  this process reads the blob (and again if its size or mtime changed)."""
  blob = local.resolve()
  if _VERIFIED.get(blob) == _stamp(blob):
    return
  if not (_SHA256.fullmatch(blob.name) or _COMMIT.fullmatch(blob.name)):
    return  # not a hash-named blob (a cache laid out by hand): nothing to check it against
  digest = _file_hash(blob, lfs=len(blob.name) == 64)
  if digest != blob.name:
    raise HubError(f"{hid}: the cached {name} is not the file it was downloaded as (its bytes "
                   f"hash to {digest[:16]}..., its blob is {blob.name[:16]}...: changed "
                   f"since, by bit rot or a bad copy); delete {blob} and load it online again")
  _VERIFIED[blob] = _stamp(blob)


def _discard(local: Path) -> None:
  """Remove a downloaded file from the cache: the blob and the snapshot's link to it."""
  blob = local.resolve()
  for p in (local, blob):
    try:
      p.unlink()
    except OSError:
      pass


def fetch(ref, kind: str = "model", *, allow_bin: bool | None = None,
          progress: bool | None = None) -> Path:
  """The local path of hub id `ref` (a `HubId` or text), downloading what `kind` loads: the
  snapshot directory (or the folder `ref.path` in it), or the file `ref.path` names.
  `progress`: the download's line and bars (None: `progress_default`)."""
  progress = progress_default(progress)
  hid = ref if isinstance(ref, HubId) else parse_hub_id(ref)
  if hid is None:
    raise HubError(f"{ref!r} is not a hub id (org/name[@revision][/path])")
  allow = allow_bin_default(allow_bin)
  if offline():
    return _from_cache(hid, kind, allow)
  from huggingface_hub import get_token

  token = get_token()
  info = _info(hid, token)
  siblings = {s.rfilename: s for s in (info.siblings or [])}
  names = set(siblings)
  what = str(hid)
  if hid.path and hid.path in names:  # a file
    files, prefix = [hid.path], ""
    if hid.path.endswith((".bin", ".pt")) and not allow and kind != "file":
      raise HubError(bin_refusal(what, [hid.path]))
  else:
    prefix = f"{hid.path}/" if hid.path else ""
    if prefix and not any(n.startswith(prefix) for n in names):
      raise HubError(f"{what}: {hid.repo} has no file or folder {hid.path!r}")
    if kind == "file":
      raise HubError(f"{what}: names a folder; name a file of {hid.repo} (org/name/path)")
    files = select_files(kind, names, prefix, allow, what)
  snapshot = _download(hid, info.sha, files, siblings, token, progress)
  index = next((f for f in files if f.endswith(".index.json")), None)
  if index:
    shards = shards_of(snapshot / index, names, prefix, what)  # named beside the index
    _download(hid, info.sha, [prefix + s for s in shards], siblings, token, progress)
  if hid.revision != info.sha:  # what the revision named, for an offline run later
    ref = _repo_folder(hid.repo) / "refs" / hid.revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(ref, info.sha)
  return snapshot / hid.path if hid.path else snapshot


def _download(hid: HubId, commit: str, files: list[str], siblings: dict, token,
              progress: bool) -> Path:
  """Download `files` of `commit` into the cache (each new one verified); the snapshot dir."""
  from huggingface_hub import hf_hub_download, try_to_load_from_cache
  from huggingface_hub.errors import HfHubHTTPError

  cache, ep = cache_dir(), endpoint()
  todo = [f for f in files if not isinstance(try_to_load_from_cache(
      hid.repo, f, cache_dir=cache, revision=commit), str)]
  need = sum(_size(siblings.get(f)) for f in todo)
  if todo:
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if need > free:
      raise HubError(f"{hid}: {need / 1e9:.2f} GB to download into {cache} but only "
                     f"{free / 1e9:.2f} GB free there (HF_HUB_CACHE moves the cache)")
    if progress:
      print(f"[hub] {hid.repo}@{commit[:12]}: downloading {len(todo)} file(s), "
            f"{need / 1e6:,.1f} MB, into {cache}", file=sys.stderr, flush=True)
  snapshot, silent = None, _silent_tqdm()
  for f in files:
    try:
      local = Path(hf_hub_download(hid.repo, f, revision=commit, cache_dir=cache, endpoint=ep,
                                   token=token, tqdm_class=None if progress else silent))
    except HfHubHTTPError as e:
      raise HubError(f"{hid}: downloading {f} failed ({_one_line(e)})") from None
    except OSError as e:
      if getattr(e, "errno", None) == 28:
        raise HubError(f"{hid}: the disk under {cache} is full while downloading {f}") from None
      raise HubError(f"{hid}: downloading {f} failed ({_one_line(e)}); run again to retry") \
          from None
    except Exception as e:  # the HTTP client's own errors (a connection cut too often)
      raise HubError(f"{hid}: downloading {f} failed ({type(e).__name__}: {_one_line(e)}); run "
                     f"again to retry") from None
    if f in todo and siblings.get(f) is not None:
      why = _verify(local, siblings[f])
      if why:
        _discard(local)
        raise HubError(f"{hid}: downloaded {f} is not the hub's file ({why}); deleted from the "
                       f"cache, run again to download it anew")
      _VERIFIED[local.resolve()] = _stamp(local)
    else:  # in the cache already: its bytes against its blob's name, once a process
      check_cached(hid, local, f)
    snapshot = Path(str(local)[:-len(f)]) if snapshot is None else snapshot
  if snapshot is None:
    snapshot = _repo_folder(hid.repo) / "snapshots" / commit
  return snapshot


def _size(sibling) -> int:
  if sibling is None:
    return 0
  lfs = getattr(sibling, "lfs", None)
  return int((lfs.size if lfs is not None else getattr(sibling, "size", 0)) or 0)


def _from_cache(hid: HubId, kind: str, allow: bool) -> Path:
  commit = _cached_commit(hid)
  where = f"the cache {cache_dir()}"
  if commit is None:
    raise HubError(f"{hid}: offline (HF_HUB_OFFLINE) and {hid.repo}@{hid.revision} is not in "
                   f"{where}; download it once online")
  snapshot = _repo_folder(hid.repo) / "snapshots" / commit
  if not snapshot.is_dir():
    raise HubError(f"{hid}: offline (HF_HUB_OFFLINE) and the cache's ref names commit "
                   f"{commit[:12]} of {hid.repo}, whose files are not in {where} (a partly "
                   f"deleted cache?); download it once online")
  names = _listing(snapshot)
  target = snapshot / hid.path if hid.path else snapshot
  if hid.path and target.is_file():
    check_cached(hid, target, hid.path)
    return target
  if kind == "file" and hid.path:  # not in the snapshot: said with the id, not its path
    near = sorted(names)[:8]
    raise HubError(f"{hid}: offline (HF_HUB_OFFLINE) and {hid.path} is not among the cached "
                   f"files of {hid.repo}@{commit[:12]} ({near}{' ...' if len(names) > 8 else ''}"
                   f"); download it once online")
  prefix = f"{hid.path}/" if hid.path else ""
  try:
    files = select_files(kind, names, prefix, allow, f"{hid} (offline, from {where})")
  except PickleRefused:
    raise  # the file is here: what to do is to allow it, not to download it
  except HubError as e:
    raise HubError(f"{e}; download it once online") from None
  index = next((f for f in files if f.endswith(".index.json")), None)
  if index:
    files = [*files, *(prefix + s for s in shards_of(snapshot / index, names, prefix, str(hid)))]
  for f in files:
    check_cached(hid, snapshot / f, f)
  return target


def commit_of(ref) -> str:
  """The commit a hub id's revision names now (offline: the cache's record of it): what a
  run's provenance records for a hub model, whose files are checked against that commit's."""
  hid = ref if isinstance(ref, HubId) else parse_hub_id(ref)
  if hid is None:
    raise HubError(f"{ref!r} is not a hub id (org/name[@revision][/path])")
  if offline():
    commit = _cached_commit(hid)
    if commit is None:
      raise HubError(f"{hid}: offline (HF_HUB_OFFLINE) and {hid.repo}@{hid.revision} is not in "
                     f"the cache {cache_dir()}")
    return commit
  from huggingface_hub import get_token

  return _info(hid, get_token()).sha


def resolve(name, kind: str = "model", *, allow_bin: bool | None = None,
            progress: bool | None = None,
            local: Callable[[str], Path | None] | None = None) -> Path:
  """`name` as a local path: an existing path as is, else what `local` makes of it (the
  model registry), else the hub id fetched; a one-line error naming the name otherwise."""
  p = Path(str(name)).expanduser()
  try:
    if p.exists():
      return p
  except OSError:  # a name too long for the file system is no local path
    pass
  if local is not None:
    found = local(str(name))
    if found is not None:
      return found
  hid = parse_hub_id(name)
  if hid is None:
    raise FileNotFoundError(f"{str(name)!r}: no such file or directory, and not a hub id "
                            f"(org/name[@revision][/path])")
  return fetch(hid, kind, allow_bin=allow_bin, progress=progress)
