"""A minimal pure-Python wheel made on the spot: what ``tools/gpu_record.py --wheels`` installs, offline, in the tests."""

from __future__ import annotations

import zipfile
from pathlib import Path


def make_wheel(folder: Path, name: str = "resacct_wheel_probe", version: str = "0.1") -> Path:
    """A minimal pure-Python wheel (one module), as ``pip wheel`` would lay it out."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": "ANSWER = 42\n", f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: resacct-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{file},,\n" for file in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for file, text in files.items():
            archive.writestr(file, text)
    return path
