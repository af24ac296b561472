"""Train the INT8 units as small torch networks, verify each on its whole input domain, and
write the verified tables with their manifest to ``luts/``.

``--check`` writes nothing: it verifies the committed tables' hashes, retrains, and exits
non-zero naming every table that differs from what the exporter produces.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from daisychain.units.luts import LutError, build_manifest, default_dir, load_luts, write_luts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=None,
                   help="directory to write (default: the package's luts/)")
    p.add_argument("--check", action="store_true",
                   help="compare the committed tables with a fresh export; write nothing")
    p.add_argument("--seed", type=int, default=0, help="first training seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from daisychain.exporter.trainers import train_all
    from daisychain.exporter.train_units import UnitVerificationError

    directory = args.out or default_dir()
    if args.check:
        try:
            committed = load_luts(directory)
        except LutError as exc:
            print(f"export-luts --check: FAIL: {exc}", file=sys.stderr)
            return 1
    try:
        results = train_all(args.seed)
    except UnitVerificationError as exc:
        print(f"export-luts: refused: {exc}", file=sys.stderr)
        return 1
    tables = {name: r.table for name, r in results.items()}
    if args.check:
        fresh = build_manifest(tables)
        bad = [name for name in sorted(tables)
               if not np.array_equal(tables[name], committed.tables()[name])]
        for name in bad:
            print(f"export-luts --check: FAIL: {directory / (name + '.bin')} differs from "
                  f"the exporter's {name} table", file=sys.stderr)
        if bad or fresh["manifest_sha256"] != committed.manifest_sha256:
            if not bad:
                print("export-luts --check: FAIL: manifest differs", file=sys.stderr)
            return 1
        print(f"export-luts --check: OK, {len(tables)} tables match "
              f"(manifest {committed.manifest_sha256[:16]}...)")
        return 0
    manifest = write_luts(tables, directory)
    print(f"wrote {len(tables)} verified tables to {directory} "
          f"(manifest_sha256 {manifest['manifest_sha256']})")
    return 0
