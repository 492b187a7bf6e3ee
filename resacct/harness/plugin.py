"""pytest items for claims: one item per claim, node id ``resacct/specs/<file>::<claim-id>``.

Loaded lazily by the ``pytest_resacct`` entry point. A malformed claim becomes a failing
:class:`SpecErrorItem` whose whole report is one line ``file:line: claim 'id': problem``;
the other claims and files still run.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import pytest

from resacct.errors import ResacctError, SpecError
from resacct.harness.evaluate import ClaimFailure, Verdict, evaluate_claim
from resacct.harness.loader import LoadedClaim, load_claims_file
from resacct.harness.pytest_settings import (CLAIM_PROPERTY, claim_hypothesis_settings, claims_hypothesis_home, examples_independent_of_imports,
                                             examples_repeat)
from resacct.harness.timing import INCONCLUSIVE_PREFIX

__all__ = ["ClaimsFile", "ClaimItem", "SpecErrorItem", "finish_record", "spec_group", "is_machine_dependent", "MACHINE_DEPENDENT_KEYWORD", "TIMED_KEYWORD"]

REQUIRE_GPU_VARIABLE = "RESACCT_REQUIRE_GPU"


class ClaimsFile(pytest.File):
    def __init__(self, *, seen_ids: dict[str, str] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.seen_ids = seen_ids if seen_ids is not None else {}

    def _display_path(self) -> str:
        try:
            return str(self.path.relative_to(self.config.rootpath))
        except ValueError:
            return str(self.path)

    def collect(self):  # type: ignore[no-untyped-def]
        from resacct.measurement.machine_profile import this_machine

        this_machine()  # the profile (and its load average at start) is read once, before any claim runs
        display = self._display_path()
        loaded = load_claims_file(self.path, display_path=display)
        area = loaded.area or self.path.name.split(".")[0]
        for error in loaded.errors:
            yield SpecErrorItem.from_parent(self, name=error.claim_id or "<file>", error=error, area=area)
        for claim in loaded.claims:
            first = self.seen_ids.get(claim.id)
            if first is not None:
                error = SpecError(f"duplicate claim id (first defined at {first})", path=display, line=claim.line, claim_id=claim.id)
                yield SpecErrorItem.from_parent(self, name=f"{claim.id}@{claim.line}", error=error, area=loaded.area)
                continue
            self.seen_ids[claim.id] = f"{display}:{claim.line}"
            yield ClaimItem.from_parent(self, name=claim.id, loaded=claim)


MACHINE_DEPENDENT_KEYWORD = "resacct_machine_dependent"
#: ``-k resacct_timed``: the claims whose check is a time measured here (``timing=True``)
TIMED_KEYWORD = "resacct_timed"


def is_machine_dependent(claim: LoadedClaim) -> bool:
    """A claim whose outcome depends on the machine: it names a kind of machine (``when:``) or is
    timed on this one (its check is registered with ``timing=True``)."""
    from resacct.harness.registry import get_check

    return bool(claim.claim.when) or get_check(claim.claim.measure).timing


def _is_timed(claim: LoadedClaim) -> bool:
    from resacct.harness.registry import get_check

    return get_check(claim.claim.measure).timing


def _declared_evidence(measure: str) -> str | None:
    """What decides the claim: the evidence its check declares (``@check(..., evidence=...)``:
    measured, published or arithmetic), None when the check declares none."""
    from resacct.harness.registry import get_check

    return get_check(measure).evidence


def spec_group(claim: LoadedClaim) -> str:
    """The xdist group of a claim: its spec file's name (``account.claims.yaml``)."""
    return "claims:" + claim.path.replace("\\", "/").rsplit("/", 1)[-1]


def _base_record(area: str, path: str, line: int | None, claim_id: str) -> dict[str, Any]:
    return {"id": claim_id, "area": area, "path": path, "line": line}


class SpecErrorItem(pytest.Item):
    """A claim (or file) that could not be loaded: fails with its one-line message."""

    def __init__(self, *, error: SpecError, area: str = "", **kwargs: Any):
        super().__init__(**kwargs)
        self.error = error
        record = _base_record(area or "?", error.path, error.line, error.claim_id or "<file>")
        record.update(status="invalid", says="", message=str(error))
        self.user_properties.append((CLAIM_PROPERTY, record))

    def runtest(self) -> None:
        raise self.error

    def repr_failure(self, excinfo, style=None):  # type: ignore[no-untyped-def]
        return str(self.error)

    def reportinfo(self):  # type: ignore[no-untyped-def]
        return self.path, (self.error.line or 1) - 1, f"invalid claims spec: {self.error.claim_id or self.error.path}"


class ClaimItem(pytest.Item):
    def __init__(self, *, loaded: LoadedClaim, **kwargs: Any):
        super().__init__(**kwargs)
        self.loaded = loaded
        self.last_inputs: dict[str, Any] | None = None
        claim = loaded.claim
        for mark in claim.marks:  # unregistered on purpose: a host's --strict-markers must not depend on resacct
            self.add_marker(pytest.MarkDecorator(pytest.Mark(mark, (), {}, _ispytest=True), _ispytest=True))
        if is_machine_dependent(loaded):  # `-k resacct_machine_dependent` (resacct verify --machine-dependent) selects these
            self.extra_keyword_matches.add(MACHINE_DEPENDENT_KEYWORD)
        if _is_timed(loaded):
            self.extra_keyword_matches.add(TIMED_KEYWORD)
        if self.config.pluginmanager.hasplugin("xdist"):  # under --dist loadgroup a file's claims (and their meta-tests) share a worker
            self.add_marker(pytest.mark.xdist_group(spec_group(loaded)))
        self.record = _base_record(loaded.area, loaded.path, loaded.line, claim.id)
        self.record.update(
            says=claim.says,
            source=loaded.source,
            measure=claim.measure,
            evidence=_declared_evidence(claim.measure),
            status=claim.status,
            law=claim.law,
            expect=_plain(claim.expect.model_dump(exclude_none=True)) if claim.expect else None,
            truth=claim.truth,
            marks=list(claim.marks),
            requires_torch=claim.requires_torch,
            requires_transformers=claim.requires_transformers,
            when=_plain(dict(claim.when)),
            given=_plain(dict(claim.given)),
            forall=dict(claim.forall),
        )
        self.user_properties.append((CLAIM_PROPERTY, self.record))

    def runtest(self) -> None:
        started_cpu = time.process_time()
        try:
            with warnings.catch_warnings():
                # torch.distributed's own imports use torch.jit, which torch 2.13 deprecates: torch's, not the
                # claim's, and not the host project's to see (67 lines under `pytest --pyargs resacct`).
                warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
                self._run_claim()
        finally:
            # the CPU seconds of the process that ran it (every thread; not the gloo ranks or children it
            # started): beside a neighbour, or a worker at idle priority, the wall seconds are the neighbour's too
            self.record["cpu_seconds"] = round(time.process_time() - started_cpu, 6)

    def _run_claim(self) -> None:
        from resacct.harness.registry import NotMeasurable, get_check
        from resacct.harness.timing import REQUIRE_TIMING_VARIABLE, Inconclusive, decide_timing_claim

        self.last_inputs = None
        claim = self.loaded.claim
        if claim.when:
            _require_machine(claim.when)
        if claim.requires_torch:
            _require_torch(claim.requires_torch)
        if claim.requires_transformers:
            _require_transformers(claim.requires_transformers)
        if "gpu" in claim.marks:
            _require_gpu()
        try:
            if claim.forall:
                self._run_forall()
            elif get_check(claim.measure).timing:
                self.last_inputs = dict(claim.given)
                self._remember(decide_timing_claim(self.loaded, self.last_inputs))
            else:
                self.last_inputs = dict(claim.given)
                self._remember(evaluate_claim(self.loaded, self.last_inputs, remember=True))
        except NotMeasurable as reason:
            pytest.skip(f"not measurable here: {reason}")
        except Inconclusive as noisy:
            self._remember(noisy.verdict)
            if os.environ.get(REQUIRE_TIMING_VARIABLE, "") not in {"", "0"}:  # the claim's own failure: its rounds, band and why
                self._remember(noisy.verdict, failing=True)
                raise ClaimFailure(f"claim '{claim.id}' is undecided on this machine, and {REQUIRE_TIMING_VARIABLE}=1 counts that as failed: "
                                   f"{noisy.reason}", noisy.verdict) from None
            pytest.skip(str(noisy))
        except ClaimFailure as failure:  # the report shows the failing example's law, prediction and measurement
            self._remember(failure.verdict, failing=True)
            raise
        except AssertionError as error:  # (after ClaimFailure, one) inside torch's own measuring tools: a known limit of this version is a skip
            from resacct.measurement.torch_limits import torch_limitation

            limit = torch_limitation(error)
            if limit is None:
                raise
            pytest.skip(f"not measurable here: {limit}")

    def _run_forall(self) -> None:
        from hypothesis import given

        from resacct.harness.strategies import get_strategy

        claim = self.loaded.claim
        strategies = {name: get_strategy(spec) for name, spec in claim.forall.items()}
        examples: list[int] = [0]
        replayed: list[int] = [0]  # of them, judged on a measurement an earlier run stored (resacct.harness.replay)

        def law_for_drawn_inputs(**drawn: Any) -> None:
            examples[0] += 1
            self.last_inputs = {**claim.given, **drawn}  # after a failure, hypothesis replays the smallest example last
            verdict = evaluate_claim(self.loaded, self.last_inputs, remember=True)
            replayed[0] += verdict.replayed_from is not None
            self._remember(verdict)

        # Each claim keeps its own entry in hypothesis' example database.
        law_for_drawn_inputs._hypothesis_internal_add_digest = self.nodeid.encode()  # type: ignore[attr-defined]
        # resacct's Hypothesis settings apply to this claim only, never globally (see harness.pytest_settings).
        test = claim_hypothesis_settings(claim.examples)(given(**strategies)(law_for_drawn_inputs))
        with claims_hypothesis_home(), examples_independent_of_imports():  # nothing of Hypothesis' lands in a .hypothesis/ where the run started
            test()
        self.record["examples"] = examples[0]
        if replayed[0] < examples[0]:  # "replayed" only where no example was measured now
            self.record.pop("replayed_from", None)
        if examples_repeat():  # the next verify on this setup finds these examples stored: its scheduling counts the claim as replayed
            from resacct.harness.evaluate import FORALL_EXAMPLES_NOTE, forall_examples_inputs
            from resacct.harness.replay import store_measurement

            store_measurement(FORALL_EXAMPLES_NOTE, forall_examples_inputs(claim), examples[0])

    def _remember(self, verdict: Verdict, *, failing: bool = False) -> None:
        """Record the example to show: the failing one, else (forall) the one farthest from the law."""
        from resacct.harness.report import remember_example

        if self.loaded.claim.truth and verdict.measured is not None:
            from resacct.harness.schema import fill_truth

            self.record["truth"] = fill_truth(self.loaded.claim.truth, {**verdict.inputs, **verdict.quantities, "measured": verdict.measured})
        if verdict.replayed_from is not None:  # judged on a measurement an earlier verify stored (resacct.harness.replay)
            self.record["replayed_from"] = verdict.replayed_from
        if self.record.get("evidence") == "recorded":  # the GPU record the claim replays, named in report.json
            self.record["recorded_from"] = {key: verdict.quantities.get(key) for key in ("board", "recorded_on", "record_file")}
        remember_example(self.record, dict(
            inputs=_plain(verdict.inputs),
            law_value=_plain(verdict.law_value),
            quantities=_plain(verdict.quantities),
            predicted=_plain(verdict.predicted),
            measured=_plain(verdict.measured if verdict.raised is None else f"raised {type(verdict.raised).__name__}: {verdict.raised}"),
        ), failing=failing)

    def repr_failure(self, excinfo, style=None):  # type: ignore[no-untyped-def]
        location = f"{self.loaded.path}:{self.loaded.line}: "
        if isinstance(excinfo.value, ClaimFailure):
            return location + str(excinfo.value)
        if isinstance(excinfo.value, ResacctError):
            return location + f"claim '{self.loaded.id}': {excinfo.value}"
        # Anything else (a negative dimension, a NaN reaching torch): one line of cause; the
        # traceback (hundreds of lines through hypothesis and torch) only when asked for.
        line = location + f"claim '{self.loaded.id}': {_foreign_cause(excinfo.value, self.loaded.claim.measure)}{_for_inputs(self.last_inputs)}"
        if self.config.get_verbosity() > 0 or self.config.getoption("tbstyle", "auto") == "long":
            return f"{line}\n{super().repr_failure(excinfo, style=style)}"
        return line + "; pytest -v shows the traceback"

    def reportinfo(self):  # type: ignore[no-untyped-def]
        return self.path, self.loaded.line - 1, f"claim {self.loaded.id}"


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    first = text.splitlines()[0].strip() if text else ""
    first = first if len(first) <= 200 else first[:199] + "…"
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _foreign_cause(error: BaseException, measure: str) -> str:
    """One line for an exception that is not resacct's: what raised what."""
    if isinstance(error, BaseExceptionGroup):  # hypothesis found several distinct failures
        leaves = list(_leaves(error))
        return f"{len(leaves)} different errors; the first: {_foreign_cause(leaves[0], measure)}"
    if type(error).__module__.startswith("hypothesis"):
        return f"hypothesis stopped: {_one_line(error)}"
    if getattr(error, "resacct_raised_by_check", None) is not None:
        return f"check {measure!r} raised {_one_line(error)}"
    return f"the harness failed with {_one_line(error)}; please report this as a resacct bug"


def _leaves(group: BaseExceptionGroup):  # type: ignore[no-untyped-def]
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


def _for_inputs(inputs: dict[str, Any] | None) -> str:
    if not inputs:
        return ""
    shown = ", ".join(f"{key}={_short_repr(value)}" for key, value in inputs.items())
    return f" (inputs: {shown if len(shown) <= 200 else shown[:199] + '…'})"


def _short_repr(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"<integer of about {int(value.bit_length() * 0.30103)} digits>"
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _require_torch(specifier: str) -> None:
    import torch
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    installed = Version(torch.__version__.split("+")[0])
    if installed not in SpecifierSet(specifier):
        pytest.skip(f"claim is about torch {specifier}; this is torch {torch.__version__}")


def _require_transformers(specifier: str) -> None:
    """Skip unless the installed transformers is in ``specifier`` (read from its metadata; nothing is imported)."""
    import importlib.metadata

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    try:
        installed = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"claim is about transformers {specifier}; transformers is not installed")
    if Version(installed) not in SpecifierSet(specifier):
        pytest.skip(f"claim is about transformers {specifier}; this is transformers {installed}")


def _require_machine(when: dict[str, Any]) -> None:
    from resacct.measurement.machine_profile import this_machine, unmet_conditions

    unmet = unmet_conditions(this_machine(), when)
    if unmet:
        pytest.skip(f"about machines where {'; '.join(unmet)}")


def _require_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        return
    reason = f"needs a CUDA GPU; torch {torch.__version__} sees none (torch.cuda.is_available() is False)"
    if os.environ.get(REQUIRE_GPU_VARIABLE, "") not in {"", "0"}:
        pytest.fail(f"{REQUIRE_GPU_VARIABLE} is set, but this claim {reason}", pytrace=False)
    pytest.skip(reason)


def _plain(value: Any) -> Any:
    """JSON- and xdist-safe copy of a value (numbers, strings, bools, lists, dicts; else repr)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 10_000:
        return _short_repr(value)  # json.dumps refuses ints over 4,300 digits
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, (list, tuple)):
        return [_plain(element) for element in value]
    if isinstance(value, dict):
        return {str(key): _plain(element) for key, element in value.items()}
    return repr(value)


def finish_record(record: dict[str, Any], report: pytest.TestReport) -> dict[str, Any]:
    """The record of a finished claim item, with its outcome: holds, refuted, skipped, inconclusive, failed, invalid,
    and ``seconds``: how long pytest's report says it ran (the call; a failed setup's setup)."""
    finished = dict(record)
    finished["seconds"] = round(float(getattr(report, "duration", 0.0) or 0.0), 6)  # the phase that decided it (resacct verify --durations)
    if finished.get("status") == "invalid":
        finished["outcome"] = "invalid"
    elif report.skipped:
        longrepr = report.longrepr
        finished["message"] = longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)
        finished["outcome"] = "inconclusive" if finished["message"].startswith(INCONCLUSIVE_PREFIX) else "skipped"
    elif report.failed:
        finished["outcome"] = "failed"
        finished["message"] = str(report.longrepr)
    else:
        finished["outcome"] = finished.get("status", "holds")
    return finished


