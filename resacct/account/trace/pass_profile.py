"""Where an account's time goes (``resacct account --profile``): CPU and wall seconds per pass —
import, cache (reading and writing :mod:`resacct.account.trace.cache`'s file), load/build, trace (the step's FLOPs with its forward and backward), state (the optimizer
step that makes the state), activations (a forward under the saved-tensor hooks of its own), peak
(the step on fake tensors, or the allocator's run), time (timed steps), render — each second
charged to the innermost pass running, so the passes never add up to more than the time around them.

The passes are the account's own functions, wrapped while :meth:`PassProfile.installed` is
active: every ``resacct.*`` module that holds one of them (a ``from … import`` included) sees the
timed wrapper, and each gets its original back at the end. Outside an installed profile a wrapper
(one a module imported during the profile keeps) just calls through.

>>> profile = PassProfile()
>>> with profile.timing("render"):
...     with profile.timing("peak"):
...         _ = sum(range(1000))
>>> sorted(profile.seconds()), profile.seconds()["render"]["wall_seconds"] >= 0
(['peak', 'render'], True)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["PASSES", "PassProfile", "pass_profile", "profile_text", "collector_off"]

#: The passes in the order a step's account runs them (``other``: the rest of the time measured around them).
PASSES = ("import", "cache", "load/build", "trace", "state", "activations", "peak", "cuda step", "real run", "time", "render")

#: (module, attribute — ``Class.method`` for a method, pass, a context manager?) for each timed function.
_TARGETS: tuple[tuple[str, str, str, bool], ...] = (
    ("resacct.account.trace.cache", "read_stored", "cache", False),
    ("resacct.account.trace.cache", "write_stored", "cache", False),
    ("resacct.account.load.hf_models", "load_hf_config", "load/build", False),
    ("resacct.account.load.hf_models", "build_hf_model", "load/build", False),
    ("resacct.account.load.hf_models", "layer_stack", "load/build", False),  # the config's first read: transformers' import
    ("resacct.account.load.model_factory", "load_model", "load/build", False),
    ("resacct.training.gpt", "build_gpt", "load/build", False),
    ("resacct.account.trace.step_measurements", "measure_step_once", "trace", False),
    ("resacct.account.trace.step_measurements", "trace_step_flops", "trace", False),
    ("resacct.account.trace.step_measurements", "measure_training_state", "state", False),
    ("resacct.account.trace.step_measurements", "_RecipeTraining.step", "state", False),
    ("resacct.measurement.activation_recording", "record_saved_activations", "activations", True),
    ("resacct.account.peak.step_peak", "account_step_peak", "peak", False),
    ("resacct.account.peak.step_peak", "predict_step_peak", "peak", False),
    ("resacct.account.peak.step_peak", "measure_step_peak", "peak", False),
    ("resacct.account.gpu.tracing.cuda_step", "predict_cuda_step_memory", "cuda step", False),  # --device BOARD: the step as CUDA runs it
    ("resacct.account.answers.gpt_step", "_measure_for_real", "real run", False),
    ("resacct.account.answers.generic", "_measure_peaks", "real run", False),
    ("resacct.account.answers.gpt_step", "_time_step", "time", False),
)

_active: list[PassProfile] = []


class PassProfile:
    """Exclusive CPU (``time.process_time``) and wall (``time.perf_counter``) seconds per pass."""

    def __init__(self) -> None:
        self.cpu_seconds: dict[str, float] = {}
        self.wall_seconds: dict[str, float] = {}
        self._stack: list[str] = []
        self._mark = (time.process_time(), time.perf_counter())

    def add(self, name: str, cpu_seconds: float, wall_seconds: float) -> None:
        """Charge a pass timed elsewhere (the import, before this module could be imported)."""
        self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + cpu_seconds
        self.wall_seconds[name] = self.wall_seconds.get(name, 0.0) + wall_seconds

    def _charge(self) -> None:
        now = (time.process_time(), time.perf_counter())
        if self._stack:
            self.add(self._stack[-1], now[0] - self._mark[0], now[1] - self._mark[1])
        self._mark = now

    @contextlib.contextmanager
    def timing(self, name: str, *, outermost_only: bool = False) -> Iterator[None]:
        """Time the body as ``name`` (nested passes take their own seconds out of it); with
        ``outermost_only`` the body counts to the pass already running, if any."""
        if outermost_only and self._stack:
            yield
            return
        self._charge()
        self._stack.append(name)
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()

    @contextlib.contextmanager
    def installed(self) -> Iterator[PassProfile]:
        """The account's pass functions timed into this profile while the body runs."""
        restore: list[tuple[Any, str, Any]] = []
        for module_name, attribute, name, is_context in _TARGETS:
            module = importlib.import_module(module_name)
            owner_name, _, method = attribute.rpartition(".")
            if owner_name:
                owner = getattr(module, owner_name)
                original = owner.__dict__[method]
                restore.append((owner, method, original))
                setattr(owner, method, _timed(original, name, is_context))
                continue
            original = getattr(module, attribute)
            wrapper = _timed(original, name, is_context)
            for holder in [m for key, m in list(sys.modules.items()) if key.startswith("resacct") and m is not None]:
                for key, value in list(vars(holder).items()):
                    if value is original:
                        restore.append((holder, key, original))
                        setattr(holder, key, wrapper)
        _active.append(self)
        try:
            yield self
        finally:
            _active.remove(self)
            for holder, key, original in reversed(restore):
                setattr(holder, key, original)

    def seconds(self) -> dict[str, dict[str, float]]:
        """``{pass: {"cpu_seconds": …, "wall_seconds": …}}`` for the passes that ran, in :data:`PASSES` order."""
        names = [name for name in PASSES if name in self.wall_seconds] + sorted(set(self.wall_seconds) - set(PASSES))
        return {name: {"cpu_seconds": round(self.cpu_seconds[name], 4), "wall_seconds": round(self.wall_seconds[name], 4)} for name in names}

    def report(self, total_cpu_seconds: float, total_wall_seconds: float) -> dict[str, dict[str, float]]:
        """:meth:`seconds` with ``other`` (the time around the passes that none of them took) and ``total``."""
        passes = self.seconds()
        cpu = sum(self.cpu_seconds.values())
        wall = sum(self.wall_seconds.values())
        passes["other"] = {"cpu_seconds": round(max(total_cpu_seconds - cpu, 0.0), 4), "wall_seconds": round(max(total_wall_seconds - wall, 0.0), 4)}
        passes["total"] = {"cpu_seconds": round(total_cpu_seconds, 4), "wall_seconds": round(total_wall_seconds, 4)}
        return passes

    def publish(self, started: tuple[float, float], fields: dict[str, Any] | None, stream: Any = None) -> None:
        """The passes and the total since ``started`` (process CPU, wall): under ``fields["profile_seconds"]``
        (``--json``), else as :func:`profile_text` on ``stream`` (stderr)."""
        report = self.report(time.process_time() - started[0], time.perf_counter() - started[1])
        if fields is not None:
            fields["profile_seconds"] = report
        else:
            print(profile_text(report), file=stream or sys.stderr)


class _NoProfile:
    """What ``pass_profile(False, …)`` gives: the same context managers, timing nothing."""

    def installed(self) -> Any:
        return contextlib.nullcontext(self)

    def timing(self, name: str, *, outermost_only: bool = False) -> Any:
        return contextlib.nullcontext()

    def publish(self, started: tuple[float, float], fields: dict[str, Any] | None, stream: Any = None) -> None:
        return None


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """A command's build and traces with Python's cyclic collector off: importing transformers and
    tracing a step make hundreds of thousands of long-lived objects, and each time they pass a
    threshold the collector scans every object in the process — a cold ``account --hf-config
    llama-2-70b`` ran 8 full collections (0.8 CPU s of 13, 2 shared cores under load), each freeing a few dozen objects.
    The traces free what they make by reference counts (the peak's pass pauses the collector
    already: the numbers cannot change). After the block everything alive joins the oldest
    generation unscanned (``gc.freeze``, ``gc.unfreeze``): nothing stays frozen, nothing is lost. In a
    process that keeps objects frozen already (a claims run, the test suite: resacct.harness.collector)
    the block's objects are left where they are: unfreezing would thaw the process's own frozen ones too."""
    import gc

    was_enabled = gc.isenabled()
    frozen_before = gc.get_freeze_count()
    gc.disable()
    try:
        yield
    finally:
        if frozen_before == 0:
            gc.freeze()  # all of it to the permanent generation, then back to the oldest one: no scan of what the block made
            gc.unfreeze()
        if was_enabled:
            gc.enable()


def pass_profile(enabled: bool, started: tuple[float, float]) -> PassProfile | _NoProfile:
    """A profile whose ``import`` pass is the (CPU, wall) seconds since ``started`` (the command
    began; resacct.account, torch with it, imported since), or with ``enabled`` False one that times nothing."""
    if not enabled:
        return _NoProfile()
    profile = PassProfile()
    profile.add("import", time.process_time() - started[0], time.perf_counter() - started[1])
    return profile


def _timed(original: Callable[..., Any], name: str, is_context: bool) -> Callable[..., Any]:
    if is_context:
        @contextlib.contextmanager
        @functools.wraps(original)
        def timed_context(*args: Any, **kwargs: Any) -> Iterator[Any]:
            timing = _active[-1].timing(name, outermost_only=True) if _active else contextlib.nullcontext()
            with timing, original(*args, **kwargs) as value:
                yield value

        return timed_context

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if not _active:
            return original(*args, **kwargs)
        with _active[-1].timing(name):
            return original(*args, **kwargs)

    return timed


def profile_text(report: dict[str, dict[str, float]]) -> str:
    """The lines ``--profile`` prints on stderr: one per pass, CPU and wall seconds, then the total."""
    lines = ["profile: pass          CPU s    wall s"]
    lines += [f"profile: {name:<12} {times['cpu_seconds']:7.2f}  {times['wall_seconds']:7.2f}" for name, times in report.items()]
    return "\n".join(lines)
