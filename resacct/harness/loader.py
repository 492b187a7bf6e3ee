"""Claims files → validated claims, each with the line it starts on.

Problems are collected, not raised one at a time: a bad claim becomes a :class:`SpecError`
naming file, line and claim id, while the good claims of the same file still load. YAML
anchors/aliases are refused (no billion-laughs expansion) and files are size-limited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from resacct.errors import LawError, ResacctError, SpecError, UnknownNameError
from resacct.harness.laws import Law
from resacct.harness.schema import Claim, ClaimsFileHeader

__all__ = ["LoadedClaim", "LoadedFile", "load_claims_file", "MAX_FILE_BYTES"]

MAX_FILE_BYTES = 1_000_000


@dataclass(frozen=True)
class LoadedClaim:
    claim: Claim
    path: str
    line: int
    area: str
    source: str
    law: Law | None

    @property
    def id(self) -> str:
        return self.claim.id


@dataclass
class LoadedFile:
    path: str
    area: str = ""
    claims: list[LoadedClaim] = field(default_factory=list)
    errors: list[SpecError] = field(default_factory=list)


_SCALARS = yaml.constructor.SafeConstructor()  # builds ints, floats, bools, strings from resolved scalar nodes

_ALLOWED_TAGS = {
    "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq",
}


def _to_python(node: yaml.Node, path: str) -> Any:
    """Plain Python data from a composed node; refuses aliases, duplicate keys and foreign tags."""
    line = node.start_mark.line + 1
    if node.tag not in _ALLOWED_TAGS:
        raise SpecError(f"YAML tag {node.tag!r} is not allowed; claims hold plain strings, numbers, lists and mappings", path=path, line=line)
    if isinstance(node, yaml.ScalarNode):
        try:
            return _SCALARS.construct_object(node, deep=True)
        except yaml.YAMLError as error:
            raise SpecError(f"invalid YAML value {node.value!r}: {getattr(error, 'problem', error)}", path=path, line=line) from None
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(child, path) for child in node.value]
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _to_python(key_node, path)
            if not isinstance(key, (str, int, float, bool)):
                raise SpecError(f"mapping keys must be plain words, got {key!r}", path=path, line=key_node.start_mark.line + 1)
            if key in result:
                raise SpecError(f"duplicate key {key!r}", path=path, line=key_node.start_mark.line + 1)
            result[key] = _to_python(value_node, path)
        return result
    raise SpecError(f"unsupported YAML node {type(node).__name__}", path=path, line=line)


class _NoAliasComposer(yaml.SafeLoader):
    """Composes nodes but refuses anchors and aliases outright (bounded work and memory)."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise SpecError("YAML aliases (*name) are not allowed in claims files", line=event.start_mark.line + 1)
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise SpecError(f"YAML anchors (&{anchor}) are not allowed in claims files", line=event.start_mark.line + 1)
        return super().compose_node(parent, index)


# YAML 1.1 (PyYAML) reads 1e-8 and 3.4e38 as strings; claims mean numbers (as YAML 1.2 does).
_NoAliasComposer.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _char(character: int | str) -> str:
    return repr(chr(character) if isinstance(character, int) else character)


def _compose(text: str, path: str) -> yaml.Node | None:
    try:
        loader = _NoAliasComposer(text)
    except yaml.reader.ReaderError as error:
        line = text[: error.position].count("\n") + 1
        raise SpecError(f"invalid YAML: unprintable character {_char(error.character)} at position {error.position}", path=path, line=line) from None
    try:
        return loader.get_single_node()
    except SpecError as error:
        raise SpecError(error.problem, path=path, line=error.line) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(part for part in (error.context, error.problem) if part)
        raise SpecError(f"invalid YAML: {problem}", path=path, line=line) from None
    except yaml.reader.ReaderError as error:
        line = text[: error.position].count("\n") + 1
        raise SpecError(f"invalid YAML: unprintable character {_char(error.character)} at position {error.position}", path=path, line=line) from None
    except yaml.YAMLError as error:
        raise SpecError(f"invalid YAML: {error}", path=path) from None
    finally:
        loader.dispose()


def _pydantic_problem(error: ValidationError, key_lines: dict[str, int], default_line: int) -> tuple[str, int]:
    first = error.errors()[0]
    location = [str(part) for part in first["loc"]]
    line = key_lines.get(location[0], default_line) if location else default_line
    kind = first["type"]
    if kind == "extra_forbidden":
        return f"unknown key {location[-1]!r}", line
    if kind == "missing":
        return f"missing required key {location[-1]!r}", line
    if len(location) >= 2 and location[0] == "given":
        return f"given.{location[1]}: expected a number, string, bool or a list of them, got {first.get('input')!r}", line
    message = first["msg"].removeprefix("Value error, ")
    where = ".".join(location)
    if where:
        return f"{where}: {message} (got {first.get('input')!r})" if kind not in {"value_error"} else f"{where}: {message}", line
    return message, line


def _key_lines(node: yaml.Node) -> dict[str, int]:
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(key.value): key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}


def load_claims_file(path: Path | str, display_path: str | None = None) -> LoadedFile:
    """Parse, validate and resolve one claims file. Never raises for a bad file: see ``errors``."""
    shown = display_path or str(path)
    loaded = LoadedFile(path=shown)
    try:
        size_bytes = Path(path).stat().st_size  # checked before reading: a huge file is never loaded
        if size_bytes > MAX_FILE_BYTES:
            raise SpecError(f"file is {size_bytes} bytes; claims files may be at most {MAX_FILE_BYTES}", path=shown)
        raw = Path(path).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            line = raw[: error.start].count(b"\n") + 1
            raise SpecError(f"file is not UTF-8 text: {error.reason} at byte {error.start}", path=shown, line=line) from None
        if "\t" in text:
            line = text[: text.index("\t")].count("\n") + 1
            raise SpecError("tab character; YAML indentation must use spaces", path=shown, line=line)
        root = _compose(text, shown)
        if root is None:
            raise SpecError("file is empty; expected keys 'area', 'source' and 'claims'", path=shown, line=1)
        if not isinstance(root, yaml.MappingNode):
            raise SpecError("top level must be a mapping with keys 'area', 'source' and 'claims'", path=shown, line=root.start_mark.line + 1)
        data = _to_python(root, shown)
        try:
            header = ClaimsFileHeader.model_validate(data)
        except ValidationError as error:
            problem, line = _pydantic_problem(error, _key_lines(root), 1)
            raise SpecError(problem, path=shown, line=line) from None
    except SpecError as error:
        loaded.errors.append(error)
        return loaded

    loaded.area = header.area
    claims_node = next(value for key, value in root.value if key.value == "claims")
    for claim_node, claim_data in zip(claims_node.value, data["claims"]):
        line = claim_node.start_mark.line + 1
        claim_id = claim_data.get("id") if isinstance(claim_data, dict) else None
        claim_id = str(claim_id) if claim_id is not None else f"#{len(loaded.claims) + len(loaded.errors) + 1}"
        try:
            loaded.claims.append(_load_claim(claim_data, claim_node, shown, line, header))
        except SpecError as error:
            error = SpecError(error.problem, path=shown, line=error.line or line, claim_id=claim_id)
            loaded.errors.append(error)
    return loaded


def _load_claim(data: Any, node: yaml.Node, path: str, line: int, header: ClaimsFileHeader) -> LoadedClaim:
    if not isinstance(data, dict):
        raise SpecError(f"each claim must be a mapping, got {type(data).__name__} {data!r}", line=line)
    key_lines = _key_lines(node)
    try:
        claim = Claim.model_validate(data)
    except ValidationError as error:
        problem, problem_line = _pydantic_problem(error, key_lines, line)
        raise SpecError(problem, line=problem_line) from None
    law = None
    if claim.law is not None:
        try:
            law = Law.parse(claim.law)
        except LawError as error:
            raise SpecError(str(error), line=key_lines.get("law", line)) from None
    _resolve(claim, law, key_lines, line)
    return LoadedClaim(claim=claim, path=path, line=line, area=header.area, source=claim.source or header.source, law=law)


def _resolve(claim: Claim, law: Law | None, key_lines: dict[str, int], line: int) -> None:
    """Check the claim against the registry: check exists, inputs fit it, names are known."""
    from resacct.harness.registry import get_check
    from resacct.harness.strategies import get_strategy

    try:
        check = get_check(claim.measure)
    except UnknownNameError as error:
        raise SpecError(str(error), line=key_lines.get("measure", line)) from None
    inputs = set(claim.given) | set(claim.forall)
    accepted = check.accepted_inputs()
    unknown = sorted(inputs - accepted)
    if unknown:
        where = "given" if unknown[0] in claim.given else "forall"
        raise SpecError(
            f"check {check.name!r} takes no input {unknown[0]!r}; it takes {', '.join(sorted(accepted)) or 'no inputs'}",
            line=key_lines.get(where, line),
        )
    missing = sorted(check.required_inputs() - inputs)
    if missing:
        raise SpecError(f"check {check.name!r} needs the input {missing[0]!r} in given or forall", line=line)
    _check_given_types(check, claim, key_lines.get("given", line))
    for name, strategy in claim.forall.items():
        try:
            get_strategy(strategy)
        except ResacctError as error:
            raise SpecError(f"forall.{name}: {error}", line=key_lines.get("forall", line)) from None
    if law is not None:
        known = inputs | set(check.quantities) | set(_defaults(check))
        unknown_names = sorted(law.names - known)
        if unknown_names:
            raise SpecError(
                f"law names {unknown_names[0]!r}, which is neither an input nor a quantity measured by {check.name!r} "
                f"(known: {', '.join(sorted(known)) or 'none'})",
                line=key_lines.get("law", line),
            )


_PLAIN_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,)}


def _check_given_types(check: Any, claim: Claim, line: int) -> None:
    """A given value must have the plain type the check's parameter is annotated with."""
    import typing

    try:
        hints = typing.get_type_hints(check.function)
    except Exception:  # unresolvable annotations: leave the check to runtime type checking
        return
    for name, value in claim.given.items():
        expected = hints.get(name)
        if expected not in _PLAIN_TYPES:
            continue
        if isinstance(value, bool) and expected is not bool or not isinstance(value, _PLAIN_TYPES[expected]):
            raise SpecError(
                f"given.{name}: check {check.name!r} expects {expected.__name__}, got {type(value).__name__} {value!r}",
                line=line,
            )


def _defaults(check: Any) -> dict[str, Any]:
    import inspect

    return {name: p.default for name, p in check.parameters.items() if p.default is not inspect.Parameter.empty}
