"""`python -m vocabjax.testing install`: what the tests need beyond the test extra, each in its
own folder under ~/.cache/vocabjax (never site-packages): JAX's CUDA plugin for the deviceless
GPU compiles (`vocabjax.testing.gpu_aot`) and the drafters' reference implementations from PyPI
(`vocabjax.testing.references`)."""

import argparse
import sys

from vocabjax.testing import gpu_aot, references


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m vocabjax.testing", description=__doc__)
  sub = p.add_subparsers(dest="cmd", required=True)
  i = sub.add_parser("install", help="install the CUDA plugin and the reference implementations")
  i.add_argument("--force", action="store_true", help="reinstall")
  a = p.parse_args(argv)
  gpu_aot.install(force=a.force)
  references.install(force=a.force)
  return 0


if __name__ == "__main__":
  sys.exit(main())
