"""Registered checks: small typed functions that measure a claim with torch.

A check receives the claim's inputs as keyword arguments, measures with PyTorch, asks resacct
for its prediction, and returns an :class:`Outcome`::

    @check("flops.matmul")
    def matmul(m: int, k: int, n: int) -> Outcome:
        measured = count_flops_with_torch(...)
        return Outcome(measured=measured, predicted=matmul_flops(m, k, n))

Extra measured quantities that a law may name (``law: 6*batch*params``) are declared in
``quantities=`` and returned in ``Outcome.quantities``. Check modules live in
``resacct.checks``; every module there is imported on first lookup.

Every check declares its **evidence**, what its ``measured`` value is, so that every report can
say what decides each claim (:data:`EVIDENCE_KINDS`):

- ``measured``: PyTorch itself ran it (tensors, ``torch.finfo``, FlopCounterMode, storages, the
  allocator, a clock, an optimizer step, a training run; numpy for the token-file claims);
- ``published``: a figure as a paper or a datasheet prints it (``resacct/facts``, or the spec's
  ``reported:``), read without arithmetic (units converted at most);
- ``arithmetic``: resacct's own arithmetic over the inputs (products, ratios, fits of printed
  figures; the lecture's code transcribed): nothing is measured, no printed figure is the answer;
- ``recorded``: a committed GPU record (``docs/gpu/*.json``: a board measured it once) is the
  measurement, replayed on any machine; resacct's prediction runs now (``resacct.checks.gpu_recorded``).
  The outcome names the board, the date and the file (quantities ``board``, ``recorded_on``, ``record_file``).

Between two kinds a check gets the weaker one (arithmetic, then published). A check that touches
torch is never ``arithmetic`` or ``published`` (``tests/test_evidence_kind.py`` runs them under a
profiler to show it).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from resacct.errors import ResacctError, UnknownNameError

__all__ = ["Check", "Outcome", "NotMeasurable", "check", "get_check", "all_checks", "broken_check_modules", "EVIDENCE_KINDS",
           "EVIDENCE_MEANINGS"]

CHECKS_PACKAGE = "resacct.checks"

EVIDENCE_KINDS = ("measured", "published", "arithmetic", "recorded")
EVIDENCE_MEANINGS = {
    "measured": "PyTorch ran it (tensors, FlopCounterMode, storages, the allocator, a clock, a training step; numpy for token files)",
    "published": "a figure as a paper or a datasheet prints it",
    "arithmetic": "resacct's own arithmetic over the inputs; nothing measured",
    "recorded": "a committed GPU record (board, date, file named) measured it once; resacct's prediction runs now",
}


class NotMeasurable(ResacctError):
    """Raised by a check when this environment cannot measure the claim (e.g. the installed
    torch lacks a dtype); the claim is skipped with this message as the reason."""


@dataclass(frozen=True)
class Outcome:
    """What a check found.

    ``measured`` is PyTorch's answer (a number, bool, string or list of numbers);
    ``predicted`` is resacct's own answer for the same thing (None when resacct has no
    formula for it); ``quantities`` are further measured values a law may use by name.
    """

    measured: Any
    predicted: Any = None
    quantities: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    name: str
    function: Callable[..., Outcome]
    quantities: tuple[str, ...]
    doc: str
    timing: bool = False  # the outcome is a timing on this machine: decided in rounds, may be inconclusive
    forget: tuple[Callable[[], object], ...] = ()  # clears what the check caches, so a new round measures afresh
    evidence: str | None = None  # one of EVIDENCE_KINDS: what the measured value is (None: not declared)
    paired: bool = False  # a timing whose value compares timings taken in turn: load moves it either way (timing's sign test)
    threads_matter: bool | Callable[..., bool] = False  # its values depend on torch's intra-op thread count (for these inputs)
    #: verify may replay its stored outcome on the same setup (resacct.harness.replay); timed checks never are. A callable: replayed,
    #: and what it returns for a claim's inputs (the contents of a file they name) is part of the stored measurement's key
    replay: bool | Callable[[Mapping[str, Any]], Mapping[str, Any]] = True

    def replay_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``inputs`` as a stored measurement's key names them: with what :attr:`replay` adds where it is a callable."""
        if callable(self.replay):
            return {**inputs, "replay_key": dict(self.replay(inputs))}
        return dict(inputs)

    def forget_cached(self) -> None:
        """Drop the check's cached measurements (its ``forget=`` callables) before measuring again."""
        for clear in self.forget:
            clear()

    @property
    def parameters(self) -> Mapping[str, inspect.Parameter]:
        return _signature(self.function).parameters

    def type_hints(self) -> dict[str, Any]:
        """The check function's resolved annotations (``typing.get_type_hints``; raises as it does)."""
        return _type_hints(self.function)

    def depends_on_threads(self, given: Mapping[str, Any]) -> bool:
        """Whether a claim with these ``given`` inputs measures values that depend on torch's thread
        count (``threads_matter``: True, or a predicate over the inputs; False if it raises)."""
        if not callable(self.threads_matter):
            return bool(self.threads_matter)
        try:
            return bool(self.threads_matter(**given))
        except Exception:  # noqa: BLE001 - inputs it cannot judge: the claim's own run reports them
            return False

    def required_inputs(self) -> set[str]:
        return {
            name
            for name, parameter in self.parameters.items()
            if parameter.default is inspect.Parameter.empty
            and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        }

    def accepted_inputs(self) -> set[str]:
        return set(self.parameters)

    def __call__(self, **inputs: Any) -> Outcome:
        outcome = self.function(**inputs)
        if not isinstance(outcome, Outcome):
            raise ResacctError(f"check {self.name!r} returned {type(outcome).__name__}, expected an Outcome")
        missing = set(self.quantities) - set(outcome.quantities)
        if missing:
            raise ResacctError(f"check {self.name!r} did not return its declared quantities {sorted(missing)}")
        return outcome


@functools.lru_cache(maxsize=None)
def _signature(function: Callable[..., Outcome]) -> inspect.Signature:
    """A check function's signature, made once: the loader asks ~3 times a claim (2,668 calls for the
    shipped claims; their load 385 → 261 CPU ms, ``python benchmarks/parse_costs.py``; issue 34)."""
    return inspect.signature(function)


@functools.lru_cache(maxsize=None)
def _type_hints(function: Callable[..., Outcome]) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(function)


_REGISTRY: dict[str, Check] = {}
_BROKEN_MODULES: dict[str, str] = {}  # checks module → why it failed to import
_discovered = False


def check(name: str, *, evidence: str | None = None, quantities: tuple[str, ...] = (), timing: bool = False,
          forget: tuple[Callable[[], object], ...] = (), paired: bool = False,
          threads_matter: bool | Callable[..., bool] = False,
          replay: bool | Callable[[Mapping[str, Any]], Mapping[str, Any]] = True) -> Callable[[Callable[..., Outcome]], Callable[..., Outcome]]:
    """Register ``function`` as the check called ``name`` (``area.what``).

    ``evidence``: what its measured value is, one of :data:`EVIDENCE_KINDS` (see the module's
    docstring); every check of ``resacct.checks`` declares one (a test fails otherwise; a check
    without one reads "unstated" in the reports). ``timing=True``: what it measures is a time on
    this machine, so the harness decides its claims in rounds and may call them inconclusive
    (:mod:`resacct.harness.timing`); ``forget``: the ``cache_clear`` of each cache the check reads,
    called before every round but the first. ``paired=True`` (timing checks only): its value compares
    timings taken in turn on this machine (a ratio of best-ofs of interleaved samples), so load slows
    both sides and moves a round's value up as often as down — the harness may then decide it by a
    sign test over rounds taken under load (:mod:`resacct.harness.timing`). ``threads_matter=True``
    (or a predicate over a claim's ``given``): its measured or predicted values depend on torch's
    intra-op thread count (a CPU kernel's scratch grows with it, a reduction's order follows it), so
    ``resacct verify``, whose workers run the other claims on one thread each, runs its claims in the
    phase of their own with the run's own count (:mod:`resacct.harness.workers`): the report is the
    one a single process writes. ``replay=False``: its outcome depends on something a stored measurement's key
    does not name (:mod:`resacct.harness.replay`), so ``resacct verify`` measures it every run; ``replay=f``, a function of a
    claim's inputs: what it returns joins the key (the sha256 of a file the inputs name, :func:`~resacct.account.gpu.records.recorded.record_contents`)."""
    if paired and not timing:
        raise ResacctError(f"check {name!r}: paired=True describes a timing check's value; it needs timing=True")
    if evidence is not None and evidence not in EVIDENCE_KINDS:
        raise ResacctError(f"check {name!r}: evidence={evidence!r}; expected one of {', '.join(EVIDENCE_KINDS)}")
    if timing and evidence not in (None, "measured"):
        raise ResacctError(f"check {name!r}: a timing check measures a time, so its evidence is 'measured', not {evidence!r}")

    def register(function: Callable[..., Outcome]) -> Callable[..., Outcome]:
        if name in _REGISTRY and _REGISTRY[name].function.__qualname__ != function.__qualname__:
            raise ResacctError(f"check {name!r} registered twice: {_REGISTRY[name].function.__module__} and {function.__module__}")
        _REGISTRY[name] = Check(name, function, tuple(quantities), inspect.getdoc(function) or "", timing, tuple(forget), evidence, paired,
                                threads_matter, replay)
        return function

    return register


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    package = importlib.import_module(CHECKS_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            name = f"{CHECKS_PACKAGE}.{module.name}"
            try:
                importlib.import_module(name)
            except Exception as error:  # one broken module must not hide every other area's checks
                _BROKEN_MODULES[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    _discovered = True


def get_check(name: str) -> Check:
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        area_module = f"{CHECKS_PACKAGE}.{name.split('.')[0]}"
        if area_module in _BROKEN_MODULES:
            raise ResacctError(f"check {name!r} is unavailable: {area_module} failed to import ({_BROKEN_MODULES[area_module]})") from None
        raise UnknownNameError("check", name, list(_REGISTRY)) from None


def all_checks() -> dict[str, Check]:
    _discover()
    return dict(_REGISTRY)


def broken_check_modules() -> dict[str, str]:
    """Check modules that failed to import, with the reason (their claims report it)."""
    _discover()
    return dict(_BROKEN_MODULES)
