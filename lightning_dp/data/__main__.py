"""``python -m lightning_dp.data fetch|verify|list [NAME ...] [--root ROOT]``: the shared data sets.

* ``fetch adult`` downloads Adult (``adult.data``, ``adult.test``) from the UCI archive into ``ROOT/adult/``;
  ``cervical`` and ``mnist`` likewise (``list`` names the sources and files). Each file's SHA-256 is checked
  before it is moved into place.
* ``verify adult`` checks the files already there.

ROOT defaults to ``../shared/data`` beside the project (what ``data.root`` defaults to); with another
``--root PATH``, train with ``data.root=PATH``.

Exit codes: 0 done (every file present with its published SHA-256), 1 ``verify`` found a file missing,
2 bad input (an unknown name, a folder that cannot be written), 3 offline (a source could not be reached; the
message says how to fetch the file by hand), 4 a file's SHA-256 is not the published one (nothing written).
"""

from __future__ import annotations

import argparse
import sys

from lightning_dp.data.fetch import (
    DATASETS,
    DEFAULT_ROOT,
    ChecksumError,
    OfflineError,
    data_set,
    fetch,
    verify,
)
from lightning_dp.errors import UserError, python_command

EXIT_OK, EXIT_MISSING, EXIT_BAD_INPUT, EXIT_OFFLINE, EXIT_CHECKSUM = 0, 1, 2, 3, 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_dp.data", description=__doc__.splitlines()[0],
                                     epilog="Exit codes: 0 done, 1 verify found a file missing, 2 bad input, "
                                            "3 offline, 4 wrong SHA-256 (nothing written).")
    parser.add_argument("command", choices=("fetch", "verify", "list"))
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"data sets: {', '.join(DATASETS)} (default: all)")
    parser.add_argument("--root", default=None, help=f"folder of the data sets (default: {DEFAULT_ROOT})")
    args = parser.parse_args(argv)
    root = args.root or DEFAULT_ROOT
    try:
        names = [data_set(n).name for n in args.names] or list(DATASETS)
        if args.command == "list":
            for name in names:
                ds = DATASETS[name]
                status = verify(name, root)
                print(f"{name}: {ds.source} ({ds.licence})")
                for remote in ds.files:
                    print(f"  {root}/{ds.folder}/{remote.name}  {remote.size:,} bytes  [{status[remote.name]}]  "
                          f"{remote.urls[0]}")
            return EXIT_OK
        if args.command == "verify":
            code = EXIT_OK
            for name in names:
                for file, status in verify(name, root).items():
                    print(f"{name}/{file}: {status}")
                    if status == "wrong digest":
                        code = EXIT_CHECKSUM
                    elif status == "missing" and code == EXIT_OK:
                        code = EXIT_MISSING
            if code:
                extra = f" --root {args.root}" if args.root else ""
                print(f"fix: {python_command()} -m lightning_dp.data fetch {' '.join(names)}{extra}", file=sys.stderr)
            return code
        for name in names:
            fetch(name, args.root)
    except OfflineError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_OFFLINE
    except ChecksumError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CHECKSUM
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
