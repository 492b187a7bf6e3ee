"""tools/gpu_record_wheels.py and ``gpu_record.py --wheels``: the CPU side's model code carried to the board (issue 31).

The install is tried for real (pip, offline, a wheel made here); a device run is the only place it matters, so what
must not rot is the refusal paths and the folder the steps would run with.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import gpu_record_wheels  # noqa: E402

from tests.fake_wheel import make_wheel  # noqa: E402


@pytest.mark.slow  # 2.2 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_wheels_are_installed_beside_the_image_and_named_in_what_happened(tmp_path: Path) -> None:
    pytest.importorskip("transformers")  # the install is checked by importing transformers with the folder first
    make_wheel(tmp_path)
    site, status = gpu_record_wheels.install(tmp_path, dict(os.environ))
    assert site is not None and status.startswith("installed resacct_wheel_probe-0.1-py3-none-any.whl (transformers ")
    assert (Path(site) / "resacct_wheel_probe.py").read_text() == "ANSWER = 42\n"
    assert not Path(site).is_relative_to(tmp_path)  # a temporary folder, never the device's $OUT


def test_an_empty_folder_or_a_broken_wheel_leaves_the_images_packages(tmp_path: Path) -> None:
    assert gpu_record_wheels.install(tmp_path, dict(os.environ)) == (None, f"no wheels in {tmp_path}: the image's packages")
    (tmp_path / "broken-0.1-py3-none-any.whl").write_bytes(b"not a zip")
    site, status = gpu_record_wheels.install(tmp_path, dict(os.environ))
    assert site is None and status.startswith("pip refused 1 wheels") and status.endswith("the image's packages")


def test_the_recorder_refuses_a_wheels_folder_that_is_not_there(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_record.py"), "--dry-run", "--out", str(tmp_path / "out"),
                           "--wheels", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--wheels" in done.stderr and "not a folder" in done.stderr and "Traceback" not in done.stderr
