#!/usr/bin/env python3
"""The model code the board runs, made the CPU side's (issue 31): wheels carried to the device, installed beside its torch.

A recorded step's allocations depend on the model's own code: the H200 record of 2026-11-30 ran transformers 5.17.0, this
checkout's predictions trace 5.24.0, and the Llama bf16-autocast step's reserved peak is 1.031 of the board's with 5.24
against 1.005 with 5.17 installed here (docs/gpu.md). The device machine reaches nothing outside it, so the wheels travel
with the working tree (``run``'s ``carry``, ≤ 64 MiB: transformers 5.24.0 and huggingface_hub 2.4.0 are 14 MB):

    python tools/gpu_record_wheels.py --download wheels      # here: this venv's transformers, huggingface_hub, peft
    # device run, carry ["wheels"]:  python3 tools/gpu_record.py --wheels wheels

``tools/gpu_record.py --wheels DIR`` installs them (``pip install --no-deps --no-index --target`` a temporary folder, never
$OUT) and runs every step with that folder first on ``PYTHONPATH``; if pip refuses them or transformers then fails to
import, the steps run with the image's packages and the record's header says why (``wheels``). The header's versions are
the ones the steps ran.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ("transformers", "huggingface_hub", "peft")


def download(folder: Path) -> int:
    """This environment's versions of :data:`PACKAGES` as wheels in ``folder`` (no dependencies: the image has them)."""
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for package in PACKAGES:
        try:
            pins.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            continue
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(folder), *pins], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"gpu_record_wheels.py: pip download {' '.join(pins)} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 1
    print(f"{', '.join(pins)} in {folder} ({sum(path.stat().st_size for path in folder.glob('*.whl')) / 1e6:.1f} MB): carry it, "
          f"then tools/gpu_record.py --wheels {folder}")
    return 0


def install(folder: Path, env: dict[str, str]) -> tuple[str | None, str]:
    """``folder``'s wheels installed in a temporary folder: (that folder, or None where they cannot be used; what happened)."""
    wheels = sorted(str(path) for path in folder.glob("*.whl"))
    if not wheels:
        return None, f"no wheels in {folder}: the image's packages"
    site = tempfile.mkdtemp(prefix="gpu-record-site-")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", site, *wheels],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return None, f"pip refused {len(wheels)} wheels ({(done.stderr.strip().splitlines() or [''])[-1][:200]}): the image's packages"
    check_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [site, env.get("PYTHONPATH", "")]))}
    probe = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"], capture_output=True, text=True,
                           env=check_env)
    if probe.returncode != 0:
        return None, f"transformers from the wheels does not import ({(probe.stderr.strip().splitlines() or [''])[-1][:200]}): the image's packages"
    return site, f"installed {', '.join(Path(wheel).name for wheel in wheels)} (transformers {probe.stdout.strip()})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--download", type=Path, required=True, metavar="DIR", help="the folder to put the wheels in (gitignored: wheels/)")
    return download(parser.parse_args(argv).download)


if __name__ == "__main__":
    sys.exit(main())
