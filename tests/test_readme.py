"""The README's Python examples run as doctests: what it shows is what resacct prints."""

from __future__ import annotations

import doctest
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    assert README.read_text(encoding="utf-8").count(">>> ") >= 5
    results = doctest.testfile(str(README), module_relative=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert results.attempted >= 5 and results.failed == 0


def test_readme_is_short_and_its_counts_are_the_specs():
    """Issue 21: a newcomer reads the README in five minutes, and the counts it states are today's."""
    import re

    from resacct.harness.loader import load_claims_file

    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    stated = re.search(r"\*\*(\d+) claims in (\d+) areas\*\*", text)
    assert stated, "the README states how many claims and areas there are"
    loaded = [load_claims_file(path) for path in sorted((README.parent / "resacct" / "specs").glob("*.claims.yaml"))]
    claims, areas = sum(len(file.claims) for file in loaded), len({file.area for file in loaded})
    assert (int(stated.group(1)), int(stated.group(2))) == (claims, areas), f"the specs hold {claims} claims in {areas} areas"


# ── the `resacct verify` excerpt: every line has the shape verify prints today ──


def _verify_excerpt() -> list[str]:
    """The lines of the console block under "## What `resacct verify` prints"."""
    section = README.read_text(encoding="utf-8").split("## What `resacct verify` prints", 1)[1]
    return section.split("```console\n", 1)[1].split("```", 1)[0].splitlines()


def _readme_machine(line: str):  # type: ignore[no-untyped-def]
    """The README's machine as a MachineProfile: its values read loosely, by position (the labels
    between them are left to MachineProfile.summary, which the test then compares)."""
    import dataclasses
    import re

    from resacct.measurement.machine_profile import this_machine

    segments = line.removeprefix("machine: ").removesuffix("…").split(" · ")
    architecture, os_name = segments[1].split()
    numbers = [int(value) for value in re.findall(r"\d+", segments[4])]
    load = float(re.findall(r"[\d.]+", segments[5])[0]) if len(segments) > 5 else None
    return dataclasses.replace(this_machine(), cpu_model=segments[0], architecture=architecture, os=os_name, cpu_isa=segments[2].split()[-1],
                               onednn_max_isa="", cpu_bf16_matmul=segments[3].split()[-1], physical_cores=numbers[0],
                               torch_threads=numbers[-1], load_average_start=load, gpu=False, faked=())


def _shipped_claims() -> list[dict]:
    """Every shipped claim (id, area, status, truth, marks, when) straight from the YAML."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    claims = []
    for path in sorted((README.parent / "resacct" / "specs").glob("*.claims.yaml")):
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
        claims += [{**claim, "area": document["area"]} for claim in document["claims"]]
    return claims


def _skip_reason(check, *args) -> str:  # type: ignore[no-untyped-def]
    import pytest

    with pytest.raises(pytest.skip.Exception) as skipped:
        check(*args)
    return skipped.value.msg


def _rendered_verify(monkeypatch, profile, first_refuted: list[str]) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    """(the machine line, the summary) `resacct verify` prints for the shipped claims on the
    README's machine: the claims' own truths, GPU claims and unmet `when:` skipped with the
    plugin's own reasons — rendered by the CLI's machine line and the terminal renderer."""
    import io
    from contextlib import redirect_stdout

    import torch

    from resacct.cli import verify
    from resacct.harness import plugin
    from resacct.measurement import machine_profile
    from resacct.reporting.terminal import render_summary

    monkeypatch.setattr(machine_profile, "this_machine", lambda: profile)
    monkeypatch.setattr(verify, "output_width_columns", lambda: 100)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RESACCT_REQUIRE_GPU", raising=False)
    printed = io.StringIO()
    with redirect_stdout(printed):
        verify._print_machine_line()
    records = []
    for claim in _shipped_claims():
        record = {"id": claim["id"], "area": claim["area"], "outcome": "holds", "path": "specs/x.claims.yaml", "line": 1}
        if claim.get("when") and machine_profile.unmet_conditions(profile, claim["when"]):  # the plugin's order: when, then gpu
            record.update(outcome="skipped", message=_skip_reason(plugin._require_machine, claim["when"]))
        elif "gpu" in (claim.get("marks") or []):
            record.update(outcome="skipped", message=_skip_reason(plugin._require_gpu))
        elif claim.get("status") == "refuted":
            record.update(outcome="refuted", truth=claim["truth"], measured=1)
        records.append(record)
    records.sort(key=lambda record: record["id"] not in first_refuted)  # the README's examples among those listed
    document = {"claims": records, "environment": {"torch": torch.__version__, "device": "cpu", "device_name": profile.cpu_model},
                "run": {"complete": True}}
    return printed.getvalue().rstrip("\n"), render_summary(document, width=100).splitlines()


def _count_columns(line: str, header: str) -> list[tuple[str, int]]:
    """A counts row as (token kind, where it ends) per half of the two-column table: an area (or
    total) flush left, counts right-aligned — the header's columns give the kinds and the ends."""
    import re

    half = (len(header) - 4) // 2 if header[(len(header) - 4) // 2:][:4] == "    " else len(header)
    shape = []
    for start in (0, half + 4):
        tokens = list(re.finditer(r"\S+", line[start:start + half]))
        shape += [("name" if index == 0 and token.start() == 0 else "count" if token.group().isdigit() else "word", token.end())
                  for index, token in enumerate(tokens)]
    return shape


def test_readme_verify_excerpt_is_what_verify_prints(monkeypatch):
    """Each line of the README's `resacct verify` excerpt against verify's own rendering of the
    shipped claims on the README's machine: the machine line, the counts header, every counts row
    and the total (areas that exist, counts under their columns), the section titles, the refuted
    lines (a shipped claim's id and truth, as verify cuts them) and the skip reasons — so a change
    of verify's output format, or of a claim the excerpt quotes, fails here."""
    import re

    import torch

    excerpt = _verify_excerpt()
    assert excerpt[0].startswith("$ resacct verify"), excerpt[0]
    machine = next(line for line in excerpt if line.startswith("machine: "))
    shipped = _shipped_claims()
    refuted_ids = {claim["id"] for claim in shipped if claim.get("status") == "refuted"}
    quoted = [line.split(":")[0].strip() for line in excerpt if re.match(r"^  [a-z0-9][a-z0-9-]*: ", line)]
    machine_line, rendered = _rendered_verify(monkeypatch, _readme_machine(machine), quoted)
    assert machine == machine_line

    def general(line: str) -> str:  # counts and the torch version are the run's, the words are verify's
        return re.sub(r"\d+", "N", line.replace(torch.__version__, "<torch>"))

    header = rendered[0]
    areas = {claim["area"] for claim in shipped} | {"total"}
    row_shapes = {tuple(_count_columns(line, header)) for line in rendered[1:rendered.index("")] if line.startswith(tuple(areas))}
    rendered_general = {general(line) for line in rendered}
    torch_versions = re.compile(r"torch \d[\w.+]*")
    kinds = []
    for line in excerpt[1:]:
        if line in ("⋮", "") or line == machine:
            kinds.append(line or "blank")
            continue
        if line.split()[0] == "area":
            assert line == header, f"README counts header:\n{line}\nverify prints:\n{header}"
            kinds.append("header")
        elif line.split()[0] in areas and all(token.isdigit() or token in areas for token in line.split()):
            assert tuple(_count_columns(line, header)) in row_shapes, f"README counts row out of verify's columns:\n{line}\n{header}"
            assert all(token in areas for token in line.split() if not token.isdigit()), line
            kinds.append("total" if line.startswith("total") else "row")
        elif line.split(":")[0].strip() in refuted_ids:
            assert line in rendered, f"README refuted line is not what verify prints for that claim:\n{line}"
            kinds.append("refuted claim")
        else:
            assert general(torch_versions.sub("torch <torch>", line)) in {torch_versions.sub("torch <torch>", text) for text in rendered_general}, (
                f"README line has no counterpart in verify's output:\n{line}")
            kinds.append("title or reason")
    assert kinds.index("header") < kinds.index("row") < kinds.index("total") < kinds.index("title or reason"), kinds
