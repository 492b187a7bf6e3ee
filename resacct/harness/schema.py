"""The schema of a claims file (pydantic v2; unknown keys are errors).

A file is ``area`` + ``source`` + a list of ``claims``. A claim says one thing (``says``),
names the registered check that measures it (``measure``), its inputs (``given`` fixed values
and/or ``forall`` named hypothesis strategies) and what must be true: a ``law`` (arithmetic
compared with the measurement) and/or an ``expect`` (equals, approx, at_least, at_most,
raises); with both, both must agree with the measurement. ``status: refuted`` with a ``truth``
records a statement of the sources that measurement proves false (one statement: a law or an
expect, never both, so it is clear which one is false). Numbers are numbers: ``rel: '0.1'`` (a
string) is refused, not converted. ``python -m resacct.harness.schema`` prints the JSON schema.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from resacct.measurement.machine_conditions import CONDITION_FIELDS, condition_value_problem

__all__ = ["Claim", "ClaimsFileHeader", "Expect", "Raises", "Tolerance", "json_schema", "KNOWN_MARKS", "truth_template_names", "fill_truth"]

CLAIM_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
KNOWN_MARKS = ("gpu", "slow", "distributed")

Scalar = int | float | bool | str
Value = Scalar | list[Scalar] | list[list[Scalar]]


class _Strict(BaseModel):
    # strict: a quoted '0.1' is a string, never silently a number (an int is still a fine float)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _finite(value: Any, key: str = "") -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        subject = f"{key}: must be" if key else "must be"
        raise ValueError(f"{subject} a finite number, got {value!r}")
    return value


def _cut(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 4] + "…" + text[-3:])


def _flattened(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [element for item in value for element in _flattened(item)]
    return [value]


def _when_json_schema() -> dict[str, Any]:
    """``when:`` for editors: each machine field a condition may name, with the values it takes."""
    properties: dict[str, Any] = {}
    for name, kind in CONDITION_FIELDS.items():
        if kind is bool:
            properties[name] = {"type": "boolean"}
        elif kind is int:
            properties[name] = {"anyOf": [{"type": "integer", "minimum": 0},
                                          {"type": "object", "additionalProperties": False, "minProperties": 1,
                                           "properties": {"at_least": {"type": "integer", "minimum": 0}, "at_most": {"type": "integer", "minimum": 0}}}]}
        else:
            properties[name] = {"anyOf": [{"enum": list(kind)}, {"type": "array", "minItems": 1, "items": {"enum": list(kind)}}]}
    return {"properties": properties, "additionalProperties": False,
            "description": "the kind of machine the claim is about (resacct machine prints this one's); other machines skip it"}


class Tolerance(_Strict):
    """|measured − expected| ≤ max(rel·|expected|, abs)."""

    rel: float = Field(default=0.0, ge=0)
    abs: float = Field(default=0.0, ge=0)

    @field_validator("rel", "abs")
    @classmethod
    def _must_be_finite(cls, value: float, info: Any) -> float:
        return _finite(value)


DEFAULT_TOLERANCE = Tolerance(rel=1e-9, abs=0.0)


class Raises(_Strict):
    """The measurement must raise an exception of this type name whose message matches."""

    # (the docstring above is the JSON schema's description.) ``match`` compiles with ``regex``, the
    # engine resacct.harness.evaluate searches with; ``type`` is checked against the known
    # exception classes when the loader resolves the claim.

    type: str = Field(min_length=1)
    match: str | None = None

    @field_validator("match")
    @classmethod
    def _must_compile(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                regex.compile(value)
            except (regex.error, OverflowError, RecursionError, MemoryError, ValueError) as error:  # a{4294967295}: OverflowError in re
                raise ValueError(f"match {_cut(value)} is not a valid regular expression: {error}") from None
        return value


class Expect(_Strict):
    equals: Value | None = None
    approx: float | None = None
    at_least: float | None = None
    at_most: float | None = None
    raises: Raises | None = None

    @field_validator("approx", "at_least", "at_most")
    @classmethod
    def _must_be_finite(cls, value: float | None, info: Any) -> float | None:
        return _finite(value)

    @field_validator("equals")
    @classmethod
    def _finite_elements(cls, value: Any) -> Any:
        """``equals: .nan`` could never hold (NaN equals nothing) and would put NaN into report.json."""
        for element in _flattened(value):
            _finite(element)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Expect:
        chosen = [name for name in ("equals", "approx", "at_least", "at_most", "raises") if getattr(self, name) is not None]
        if not chosen:
            raise ValueError("needs one of equals, approx, at_least, at_most, raises")
        allowed_pairs = {frozenset({"at_least", "at_most"})}
        if len(chosen) > 1 and frozenset(chosen) not in allowed_pairs:
            raise ValueError(f"combines {', '.join(chosen)}; use one of them (or at_least with at_most)")
        if self.at_least is not None and self.at_most is not None and self.at_least > self.at_most:
            raise ValueError(f"at_least {self.at_least} is above at_most {self.at_most}")
        return self


class Claim(_Strict):
    id: str = Field(pattern=CLAIM_ID_PATTERN, max_length=80)
    says: str = Field(min_length=1)
    source: str | None = None
    measure: str = Field(min_length=1)
    given: dict[str, Value] = Field(default_factory=dict)
    forall: dict[str, str] = Field(default_factory=dict)
    law: str | None = None
    expect: Expect | None = None
    tolerance: Tolerance | None = None
    status: Literal["holds", "refuted"] = "holds"
    truth: str | None = None
    marks: list[str] = Field(default_factory=list)
    examples: int | None = Field(default=None, ge=1, le=1000)
    requires_torch: str | None = None  # a version specifier such as ">=2.6"; other versions skip the claim
    requires_transformers: str | None = None  # the same for transformers (">=5.19"); other versions, or none installed, skip it
    # The kind of machine the claim is about, over resacct.measurement.machine_profile's fields:
    # ``when: {cpu_bf16_units: false}``; other machines skip it, naming the condition.
    when: dict[str, Any] = Field(default_factory=dict, json_schema_extra=lambda schema: schema.update(_when_json_schema()))

    @field_validator("when")
    @classmethod
    def _known_conditions(cls, when: dict[str, Any]) -> dict[str, Any]:
        for key, value in when.items():
            problem = condition_value_problem(key, value)
            if problem is None and isinstance(value, dict) and value.get("at_least", 0) > value.get("at_most", value.get("at_least", 0)):
                problem = (f"{key}: at_least {value['at_least']} is above at_most {value['at_most']}, a range no machine is in "
                           "(the claim would never be decided)")
            if problem:
                raise ValueError(problem)
        return when

    @field_validator("truth")
    @classmethod
    def _template_fields(cls, truth: str | None) -> str | None:
        """A truth may quote this run's measurement: ``{measured}``, ``{measured:.0%}``, ``{name:.3g}``
        for a quantity the check measures (names are checked against the check at load)."""
        if truth is not None:
            truth_template_names(truth)
        return truth

    @field_validator("requires_torch", "requires_transformers")
    @classmethod
    def _valid_specifier(cls, value: str | None) -> str | None:
        if value is not None:
            from packaging.specifiers import InvalidSpecifier, SpecifierSet

            try:
                SpecifierSet(value)
            except InvalidSpecifier:
                raise ValueError(f"{value!r} is not a version specifier; write e.g. '>=2.6' or '>=2.4,<2.8'") from None
        return value

    @field_validator("law", mode="before")
    @classmethod
    def _number_is_a_law(cls, value: Any) -> Any:
        """``law: 128`` means the same as ``law: "128"``."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            _finite(value)
            return repr(value)
        return value

    @field_validator("given")
    @classmethod
    def _finite_inputs(cls, given: dict[str, Any]) -> dict[str, Any]:
        for key, value in given.items():
            for element in _flattened(value):
                _finite(element, f"given.{key}")
        return given

    @field_validator("marks")
    @classmethod
    def _known_marks(cls, marks: list[str]) -> list[str]:
        unknown = [mark for mark in marks if mark not in KNOWN_MARKS]
        if unknown:
            raise ValueError(f"unknown mark {unknown[0]!r}; allowed: {', '.join(KNOWN_MARKS)}")
        return marks

    @model_validator(mode="after")
    def _coherent(self) -> Claim:
        if self.law is None and self.expect is None:
            raise ValueError("a claim needs a law or an expect: what must be true of the measurement?")
        if self.law is not None and self.expect is not None and self.expect.raises is not None:
            raise ValueError("a claim that expects an exception cannot also have a law")
        if self.law is not None and self.expect is not None and self.status == "refuted":
            raise ValueError("a refuted claim has both 'law' and 'expect'; refute one statement per claim "
                             "(with both, the claim passes when either is false, hiding the other)")
        if self.expect is not None and self.expect.approx is not None and self.tolerance is None:
            raise ValueError("expect.approx needs a 'tolerance' (rel and/or abs): how close is close enough?")
        if self.status == "refuted" and not self.truth:
            raise ValueError("a refuted claim needs 'truth': what measurement shows instead, and why")
        if self.status == "holds" and self.truth:
            raise ValueError("'truth' belongs to refuted claims; set status: refuted or remove it")
        if self.status == "refuted" and self.forall:
            raise ValueError("a refuted claim needs a concrete counterexample in 'given', not 'forall'")
        both = sorted(set(self.given) & set(self.forall))
        if both:
            raise ValueError(f"input {both[0]!r} is in both given and forall")
        return self


TRUTH_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([^{}]*))?\}")
_TRUTH_PART = re.compile(r"\{\{|\}\}|" + TRUTH_FIELD.pattern)  # as str.format: {{ and }} are a literal brace
_FORMAT_SPEC = re.compile(r"^[,_]?(\.\d{1,2})?[efgdn%]?$")


def truth_template_names(truth: str) -> set[str]:
    """The measured names a truth quotes (``{measured:.0%}`` → ``measured``; ``{{measured}}`` is the
    text ``{measured}``, as in ``str.format``); a malformed field is an error."""
    names = set()
    for match in _TRUTH_PART.finditer(truth):
        if match.group(1) is None:  # {{ or }}
            continue
        name, spec = match.group(1), match.group(2)
        if spec is not None and not _FORMAT_SPEC.match(spec):
            raise ValueError(f"truth field {match.group(0)!r}: format {spec!r} is not a number format such as .3g, .0% or ,d")
        names.add(name)
    return names


def fill_truth(truth: str, values: dict[str, Any]) -> str:
    """The truth with this run's numbers in its fields; a field with no value stays as written;
    ``{{`` and ``}}`` are a literal brace, as in ``str.format``.

    >>> fill_truth("bf16 reaches {measured:.0%} of fp32 here ({fp32:.3g} FLOP/s)", {"measured": 0.0171, "fp32": 1.64e11})
    'bf16 reaches 2% of fp32 here (1.64e+11 FLOP/s)'
    >>> fill_truth("{{measured}} is {measured}; a set {{{measured}}}", {"measured": 2})
    '{measured} is 2; a set {2}'
    """

    def one(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return match.group(0)[0]
        name, spec = match.group(1), match.group(2) or ""
        value = values.get(name)
        if value is None:
            return match.group(0)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return format(value, spec)
            except ValueError:  # e.g. 'd' for a float: the plain number
                return format(value, "")
        return str(value)

    return _TRUTH_PART.sub(one, truth)


class ClaimsFileHeader(_Strict):
    area: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    source: str = Field(min_length=1)
    claims: list[Any] = Field(min_length=1)


class _ClaimsFileForEditors(ClaimsFileHeader):
    """The whole file, for editors' JSON schema (the loader validates claims one by one)."""

    claims: list[Claim] = Field(min_length=1)  # type: ignore[assignment]


def json_schema() -> dict[str, Any]:
    schema = _ClaimsFileForEditors.model_json_schema()
    schema["title"] = "resacct claims file"
    return schema


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2))
