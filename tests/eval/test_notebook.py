"""notebooks/quickstart.ipynb: the install cell's pip requirement for every kind of source and
its message when there is none, and the whole notebook installed the Colab way (a git URL of
this repository, into a fresh virtual environment that sees the host's jax and torch as a
Colab runtime's) and run on tiny models: plain, chain, FR-Spec, VocabTrim and SpecVocab."""

import importlib.metadata
import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.compile import subprocess_xla_flags
from vocabjax.version import __version__

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
EXTRAS = {"eval", "gguf"}


def _cells() -> list[dict]:
  return json.loads(NOTEBOOK.read_text())["cells"]


def cell_source(tag: str) -> str:
  """The source of the code cell tagged `tag`."""
  found = [c for c in _cells() if c["cell_type"] == "code" and tag in c["metadata"].get("tags", [])]
  assert len(found) == 1, f"expected one cell tagged {tag!r}, found {len(found)}"
  return "".join(found[0]["source"])


@pytest.fixture(scope="module")
def nb():
  """The install helpers cell's namespace (standard library only: it runs before vocabjax is
  installed)."""
  ns = {"__name__": "install_helpers"}
  exec(compile(cell_source("install-helpers"), "install-helpers", "exec"), ns)
  return ns


def _parsed(req: str):
  """`req` as the pip that installs it parses it (an older pip's packaging is the stricter)."""
  from pip._vendor.packaging.requirements import Requirement

  return Requirement(req)


def test_notebook_is_plain_python():
  for i, c in enumerate(_cells()):
    if c["cell_type"] == "code":
      src = "".join(c["source"])
      assert not any(line.lstrip().startswith(("%", "!")) for line in src.splitlines()), \
          f"cell {i} uses IPython magics; keep the notebook plain Python"
      compile(src, f"cell {i}", "exec")


@pytest.mark.parametrize("source,url", [
    ("https://github.com/o/vocabjax.git", "git+https://github.com/o/vocabjax.git"),
    ("https://github.com/o/vocabjax@v0.1", "git+https://github.com/o/vocabjax@v0.1"),
    ("git+https://github.com/o/vocabjax.git@main", "git+https://github.com/o/vocabjax.git@main"),
    ("git@github.com:o/vocabjax.git@dev", "git+ssh://git@github.com/o/vocabjax.git@dev"),
    ("ssh://git@github.com/o/vocabjax.git", "git+ssh://git@github.com/o/vocabjax.git"),
    ("https://example.org/vocabjax-0.1.0-py3-none-any.whl",
     "https://example.org/vocabjax-0.1.0-py3-none-any.whl"),
    ("https://github.com/o/vocabjax/archive/refs/heads/main.zip",
     "https://github.com/o/vocabjax/archive/refs/heads/main.zip"),
])
def test_requirement_for_urls(nb, source, url):
  args = nb["pip_requirement"](source)
  assert args == [f"vocabjax[eval,gguf] @ {url}"]
  req = _parsed(args[0])
  assert (req.name, set(req.extras), req.url) == ("vocabjax", EXTRAS, url)


def test_requirement_for_local_sources(nb, tmp_path):
  pip_requirement = nb["pip_requirement"]
  # a git URL of a local repository (file://, @ref): the host spelled out, which older pips
  # (pip 23's packaging) require of a git+file URL
  for src in (f"file://{tmp_path}@abc123", f"git+file://{tmp_path}@abc123"):
    args = pip_requirement(src)
    assert args == [f"vocabjax[eval,gguf] @ git+file://localhost{tmp_path}@abc123"]
    assert _parsed(args[0]).url == f"git+file://localhost{tmp_path}@abc123"
  # a checkout directory: its path with the extras, editable only if asked
  (tmp_path / "setup.cfg").write_text("[metadata]\nname = vocabjax\n")
  assert pip_requirement(str(tmp_path)) == [f"{tmp_path}[eval,gguf]"]
  assert pip_requirement(str(tmp_path) + "/", editable=True) == ["-e", f"{tmp_path}[eval,gguf]"]
  assert pip_requirement(str(tmp_path), extras="") == [str(tmp_path)]
  assert pip_requirement(str(tmp_path), extras=[" eval "]) == [f"{tmp_path}[eval]"]
  # a wheel file: a file:// URL requirement
  whl = tmp_path / "dist dir" / "vocabjax-0.1.0-py3-none-any.whl"
  whl.parent.mkdir()
  whl.write_bytes(b"")
  args = pip_requirement(str(whl))
  assert args == [f"vocabjax[eval,gguf] @ {whl.as_uri()}"] and "%20" in args[0]
  assert _parsed(args[0]).url == whl.as_uri()


@pytest.mark.parametrize("source,kw,words", [
    ("", {}, 'os.environ["VOCABJAX_REPO"] = "https://github.com/OWNER/vocabjax.git@main"'),
    ("file:///work/main@HEAD", {}, "@HEAD is not a ref pip can check out"),
    ("https://github.com/o/vocabjax@", {}, "is not a ref pip can check out"),
    ("https://github.com/o/vocabjax.git", {"editable": True}, "editable install needs a local"),
    ("/no/such/dir", {}, "no such directory or file"),
    ("ftp://example.org/vocabjax", {}, "is not a git URL"),
    ("file:///no/such/repo", {}, "no directory /no/such/repo to clone"),
    ("/no/such/vocabjax.whl", {}, "no file /no/such/vocabjax.whl"),
    ("https://github.com/o/vocabjax", {"extras": "eval,gg uf"}, "are not extra names"),
])
def test_requirement_refused_with_what_to_do(nb, source, kw, words):
  with pytest.raises(nb["InstallError"]) as e:
    nb["pip_requirement"](source, **kw)
  assert words in str(e.value)


def test_requirement_refuses_a_directory_that_is_no_checkout(nb, tmp_path):
  with pytest.raises(nb["InstallError"], match="not a vocabjax checkout"):
    nb["pip_requirement"](str(tmp_path))


def test_plan_install(nb):
  plan, err = nb["plan_install"], nb["InstallError"]
  assert plan("", have_vocabjax=True) is None  # a checkout: nothing to install
  assert plan("  ", have_vocabjax=True, editable=True) is None
  with pytest.raises(err) as e:
    plan("", have_vocabjax=False)
  assert str(e.value) == nb["NOTHING_GIVEN"]
  assert plan("https://github.com/o/vocabjax@v1", have_vocabjax=True) == [
      "vocabjax[eval,gguf] @ git+https://github.com/o/vocabjax@v1"]


def test_import_roots(nb, tmp_path):
  """Where the install cell expects vocabjax to be imported from after pip (else: restart)."""
  import sysconfig

  assert nb["import_roots"](["-e", f"{tmp_path}[eval,gguf]"]) == [tmp_path]
  assert nb["import_roots"](["-e", str(tmp_path)]) == [tmp_path]
  roots = nb["import_roots"](["vocabjax[eval] @ git+https://github.com/o/vocabjax"])
  assert Path(sysconfig.get_paths()["purelib"]) in roots


def test_runtime_constraints_pin_what_is_installed(nb):
  pins = nb["runtime_constraints"]()
  for name in ("jax", "jaxlib", "numpy"):
    assert f"{name}=={importlib.metadata.version(name)}" in pins
  assert not any(p.startswith(("flax==", "optax==", "transformers==")) for p in pins)
  for p in pins:
    assert nb["RUNTIME_PINNED"].fullmatch(p.split("==")[0])


def test_install_cell_without_a_source_says_what_to_set(tmp_path):
  """No source and vocabjax not importable (python -S: no site-packages): the cell stops with
  the line to set, before pip or jax, and no traceback."""
  code = cell_source("install-helpers") + "\n" + cell_source("install")
  env = {k: v for k, v in os.environ.items() if k not in ("VOCABJAX_REPO", "PYTHONPATH")}
  r = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env,
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 1, r.stdout + r.stderr
  assert "Traceback" not in r.stderr and "pip" not in r.stdout
  assert 'os.environ["VOCABJAX_REPO"] = "https://github.com/OWNER/vocabjax.git@main"' in r.stderr


def test_install_cell_keeps_an_importable_vocabjax(monkeypatch, capsys):
  monkeypatch.delenv("VOCABJAX_REPO", raising=False)
  ns = {"__name__": "__main__"}
  exec(compile(cell_source("install-helpers") + "\n" + cell_source("install"), "install", "exec"),
       ns)
  assert "nothing to install" in capsys.readouterr().out
  assert "PIP_LOG" not in ns


RUNNER = textwrap.dedent("""
    import importlib.metadata, json, sys
    from pathlib import Path

    def versions():
        out = {}
        for d in importlib.metadata.distributions():
            out.setdefault(d.metadata["Name"].lower(), d.version)
        return out

    nb, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    before = versions()
    ns = {"__name__": "__main__"}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"quickstart.ipynb[cell {i}]", "exec"), ns)
    import jax, vocabjax
    out.write_text(json.dumps({
        "before": before, "after": versions(), "pip_log": ns["PIP_LOG"], "real": ns["REAL"],
        "vocabjax": vocabjax.__file__, "jax": jax.__file__, "prefix": sys.prefix,
        "plot": str(ns["PLOT"]), "gamma": ns["GAMMA"],
        "methods": {m["name"]: [m["method"], m["overall"]["tau"], m["overall"]["match_rate"]]
                    for m in ns["summary"]["methods"]}}))
""")


def runtime_venv(venv: Path) -> Path:
  """A fresh venv that sees this interpreter's packages after its own, as a Colab runtime's
  Python sees the runtime's: jax, torch, pip and setuptools come from the environment running
  the tests. `--system-site-packages` would not do: inside a virtualenv (the README reader's
  usual setup) it means the *base* interpreter's packages (no jax; setuptools 65 without
  `bdist_wheel`), not the virtualenv's. So the venv gets a .pth file that adds this
  interpreter's site directories (their own .pth files processed, as for site-packages)."""
  # --without-pip: pip comes from this interpreter's site-packages, as jax does
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  dirs = [d for d in dict.fromkeys([*site.getsitepackages(), site.getusersitepackages()])
          if Path(d).is_dir()]
  purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
  (Path(purelib) / "zz_runtime_packages.pth").write_text(
      "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
  return venv


def test_runtime_venv_sees_this_interpreters_packages_after_its_own(tmp_path):
  venv = runtime_venv(tmp_path / "venv")
  r = subprocess.run([str(venv / "bin" / "python"), "-c",
                      "import sys, jax, setuptools; print(sys.prefix); print(jax.__file__);"
                      " print(setuptools.__version__)"],
                     capture_output=True, text=True, timeout=120, cwd=tmp_path,
                     env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
  assert r.returncode == 0, r.stderr[-2000:]
  prefix, jax_file, setuptools_version = r.stdout.split()
  import jax
  assert prefix == str(venv) and jax_file == jax.__file__
  # (not imported here: after pip's modules, setuptools' distutils shim refuses to load)
  assert setuptools_version == importlib.metadata.version("setuptools")


def _published_layouts_on_a_hub(hub, tiny_dir: Path, tmp_path: Path) -> None:
  """The tiny model as org/tiny, an EAGLE-1/2 head for it in its authors' layout
  (pytorch_model.bin) as org/eagle2-head and an FR-Spec list (freq_96.pt) as org/fr."""
  import jax
  import torch

  from tests.helpers.heads import eagle2_config, eagle2_params
  from vocabjax.checkpoints.eagle2 import save_eagle2
  from vocabjax.checkpoints.loader import load_model

  files = lambda d: {f.relative_to(d).as_posix(): f.read_bytes()  # noqa: E731
                     for f in d.rglob("*") if f.is_file()}
  hub.add("org/tiny", files(tiny_dir))
  m = load_model(tiny_dir, dtype="float32")
  hc = eagle2_config(m.config)
  head = save_eagle2(eagle2_params(hc, seed=1), hc, tmp_path / "eagle2-head", pickled=True,
                     embed=m.params["embed"])
  hub.add("org/eagle2-head", files(head))
  (tmp_path / "fr").mkdir()
  torch.save([int(i) for i in range(0, m.config.vocab_size, 3)][:96],
             tmp_path / "fr" / "freq_96.pt")
  hub.add("org/fr", files(tmp_path / "fr"))
  del jax


@pytest.mark.integration
@pytest.mark.slow
def test_notebook_installs_from_git_in_a_fresh_venv_and_runs(tmp_path, tiny_chat_dir):
  """The Colab path end to end on tiny models: a venv with the host's site-packages (jax, torch,
  ... as a Colab runtime has them), VOCABJAX_REPO a file:// git URL of this repository at HEAD
  (committed code: the working tree's changes are not in it), pip offline (--no-index: nothing
  may come from the network) and the runtime's packages left as they were. The models are
  named as a user names theirs, by hub id (a hub served on 127.0.0.1, HF_ENDPOINT): the target
  and drafter, a published EAGLE-1/2 head and FR-Spec's released list (the papers' setting)."""
  from vocabjax.testing.local_hub import LocalHub
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
  if head.returncode != 0:
    pytest.skip("not a git checkout: no git URL to install from")
  hub = LocalHub()
  _published_layouts_on_a_hub(hub, tiny_chat_dir, tmp_path)
  venv = runtime_venv(tmp_path / "venv")
  runner = tmp_path / "run_notebook.py"
  runner.write_text(RUNNER)
  # (PIP_QUIET, as .ci/run sets it, would hide the "Successfully installed" line read below)
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "VOCABJAX_REPO", "PIP_QUIET")}
  env.update(VOCABJAX_REPO=f"file://{ROOT}@{head.stdout.strip()}",
             VOCABJAX_PIP_ARGS="--no-index --no-build-isolation",
             PIP_CACHE_DIR=str(tmp_path / "pip-cache"), VOCABJAX_NOTEBOOK_MODE="tiny",
             VOCABJAX_NOTEBOOK_DIR=str(tmp_path / "work"), MPLBACKEND="Agg",
             XLA_FLAGS=subprocess_xla_flags(8), HF_ENDPOINT=hub.endpoint, HF_HUB_OFFLINE="0",
             HF_HUB_CACHE=str(tmp_path / "hf-cache"), VOCABJAX_NOTEBOOK_TARGET="org/tiny",
             VOCABJAX_NOTEBOOK_DRAFT="org/tiny", VOCABJAX_NOTEBOOK_EAGLE_HEAD="org/eagle2-head",
             VOCABJAX_NOTEBOOK_FRSPEC_LIST="org/fr/freq_96.pt", VOCABJAX_NOTEBOOK_ALLOW_BIN="1")
  env.pop("HF_TOKEN", None)
  try:
    r = subprocess.run([str(venv / "bin" / "python"), str(runner), str(NOTEBOOK),
                        str(tmp_path / "result.json")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
  finally:
    hub.close()
  assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
  res = json.loads((tmp_path / "result.json").read_text())

  # installed into the venv from the git URL; jax, torch, numpy untouched and still the host's
  assert res["prefix"] == str(venv)
  assert Path(res["vocabjax"]).is_relative_to(venv), res["vocabjax"]
  assert not Path(res["jax"]).is_relative_to(venv), res["jax"]
  installed = [ln for ln in res["pip_log"].splitlines() if ln.startswith("Successfully installed")]
  assert len(installed) == 1 and installed[0].split()[2:] == [f"vocabjax-{__version__}"], installed
  assert f"Cloning file://localhost{ROOT} (to revision " in res["pip_log"]
  for name in ("jax", "jaxlib", "libtpu", "torch", "numpy"):
    assert res["after"].get(name) == res["before"].get(name), name

  # the notebook's comparison on the tiny self-drafting model, every method lossless
  assert res["real"] is False
  methods = res["methods"]
  assert [m for m, _, _ in methods.values()] == ["ar", "chain", "frspec", "vocabtrim",
                                                 "specvocab", "eagle", "eagle"]
  assert {"eagle", "eagle_frspec"} <= set(methods)
  downloaded = {p.rsplit("/", 1)[1] for _, p, _, _ in hub.requests if "/resolve/" in p}
  assert {"config.json", "pytorch_model.bin", "freq_96.pt"} <= downloaded, downloaded
  assert methods[f"chain_g{res['gamma']}"][1] == res["gamma"] + 1  # full head: all accepted
  assert all(match == 1.0 for _, _, match in methods.values()), methods
  assert Path(res["plot"]).is_file()
