"""The claims files a ``resacct verify`` runs: ``--specs`` (a folder of ``*.claims.yaml`` or one such file), narrowed by
``--area``; what cannot be a claims file is skipped with one line."""

from __future__ import annotations

import sys
from pathlib import Path

from resacct.errors import ResacctError

__all__ = ["claim_files"]


def claim_files(specs: Path, areas: list[str]) -> list[Path]:
    if specs.is_file() and specs.name.endswith(".claims.yaml"):
        files = [specs]
    elif specs.is_dir():
        files = _readable_claim_files(sorted(specs.glob("*.claims.yaml")))
    elif specs.exists():
        raise ResacctError(f"--specs {str(specs)!r} is not a *.claims.yaml file; pass a folder of them or one such file")
    else:
        raise ResacctError(f"specs folder {str(specs)!r} does not exist; pass --specs PATH to a folder of *.claims.yaml files or to one such file")
    if areas:
        wanted = {area.lower() for area in areas}
        known = sorted(path.name.removesuffix(".claims.yaml") for path in files)
        unknown = sorted(wanted - set(known))
        if unknown:
            from resacct.errors import UnknownNameError

            raise UnknownNameError("area", unknown[0], known)
        files = [path for path in files if path.name.removesuffix(".claims.yaml") in wanted]
    if not files:
        raise ResacctError(f"no *.claims.yaml files in {str(specs)!r}")
    return files


def _readable_claim_files(paths: list[Path]) -> list[Path]:
    """Skip, with one line each, what cannot be a claims file: an editor's lock (.#x.claims.yaml), a FIFO, a symlink loop."""
    from resacct.harness.loader import not_a_claims_file

    readable = []
    for path in paths:
        problem = not_a_claims_file(path)
        if problem is None:
            readable.append(path)
        else:
            print(f"resacct verify: skipped {path}: {problem}", file=sys.stderr)
    return readable
