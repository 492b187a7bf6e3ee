"""Claims files → validated claims, each with the line it starts on.

Problems are collected, not raised one at a time: a bad claim becomes a :class:`SpecError`
naming file, line and claim id, while the good claims of the same file still load (each claim
is converted from YAML on its own). Hostile YAML is handled in :mod:`resacct.harness.yaml_nodes`;
files are size-limited and only regular files are read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from resacct.errors import LawError, ResacctError, SpecError, UnknownNameError
from resacct.harness.laws import Law
from resacct.harness.schema import Claim, ClaimsFileHeader
from resacct.harness.yaml_nodes import MAX_INTEGER_DIGITS, MAX_NESTING, compose, is_refused, shown, to_python

__all__ = ["LoadedClaim", "LoadedFile", "load_claims_file", "not_a_claims_file", "MAX_FILE_BYTES", "MAX_NESTING", "MAX_INTEGER_DIGITS"]

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


def _pydantic_problem(error: ValidationError, key_lines: dict[str, int], default_line: int) -> tuple[str, int]:
    first = error.errors()[0]
    location = [str(part) for part in first["loc"]]
    line = key_lines.get(location[0], default_line) if location else default_line
    kind = first["type"]
    if kind == "extra_forbidden":
        return f"unknown key {location[-1]!r}", line
    if kind == "missing":
        return f"missing required key {location[-1]!r}", line
    if kind in {"float_type", "int_type"} and isinstance(first.get("input"), str):  # strict: '0.1' is not 0.1
        number = "an integer" if kind == "int_type" else "a number"
        return f"{'.'.join(location)}: must be {number}, got the string {shown(first['input'], 40)}; write it without quotes", line
    if len(location) >= 2 and location[0] == "given":
        return f"given.{location[1]}: expected a number, string, bool or a list of them, got {shown(first.get('input'), 80)}", line
    message = first["msg"].removeprefix("Value error, ")
    where = ".".join(location)
    if where and message.startswith(f"{where}."):  # the validator named the exact place (given.m)
        return message, line
    if where:
        return f"{where}: {message} (got {shown(first.get('input'), 80)})" if kind not in {"value_error"} else f"{where}: {message}", line
    return message, line


def _key_lines(node: yaml.Node) -> dict[str, int]:
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(key.value): key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}


def load_claims_file(path: Path | str, display_path: str | None = None) -> LoadedFile:
    """Parse, validate and resolve one claims file. Never raises for a bad file: see ``errors``.

    The same bytes under the same display path are parsed once per process (pytest's collection
    and the mutation meta-test both load every shipped file: parsing is most of their cost)."""
    shown = display_path or str(path)
    key = _cache_key(Path(path), shown)
    if key is not None and key in _PARSED:
        return _copy(_PARSED[key])
    loaded = LoadedFile(path=shown)
    try:
        loaded = _load(Path(path), shown, loaded)
    except Exception as error:  # a loader bug must cost one file, never the whole collection
        loaded.errors.append(SpecError(f"could not be loaded ({_one_line(error)}); please report this as a resacct bug", path=shown))
        loaded.claims.clear()
        return loaded
    if key is not None:
        if len(_PARSED) >= _PARSED_LIMIT:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = _copy(loaded)
    return loaded


_PARSED: dict[tuple[str, bytes], LoadedFile] = {}
_PARSED_LIMIT = 128


def _cache_key(path: Path, shown: str) -> tuple[str, bytes] | None:
    """(display path, digest of the bytes) for a regular file of allowed size; None otherwise
    (the loader then reports the problem itself)."""
    try:
        if _not_a_regular_file(path) is not None or path.stat().st_size > MAX_FILE_BYTES:
            return None
        return shown, hashlib.blake2b(path.read_bytes(), digest_size=20).digest()
    except OSError:
        return None


def _copy(loaded: LoadedFile) -> LoadedFile:
    """A file's result with its own lists (the claims themselves are frozen and shared)."""
    return LoadedFile(path=loaded.path, area=loaded.area, claims=list(loaded.claims), errors=list(loaded.errors))


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    first = first if len(first) <= 200 else first[:199] + "…"
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def not_a_claims_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as a claims file — an editor's lock file ``.#name``, a FIFO,
    a dangling symlink, a symlink loop — as a noun phrase; None for a regular file."""
    if path.name.startswith("."):
        return "a hidden file (an editor's lock file?), not a claims file"
    return _not_a_regular_file(path)


def _not_a_regular_file(path: Path) -> str | None:
    import errno
    import stat

    try:
        mode = path.stat().st_mode  # never open() it: opening a FIFO blocks until a writer comes
    except FileNotFoundError:
        return "a dangling symlink (its target does not exist)" if path.is_symlink() else "no such file"
    except OSError as error:
        return "a symlink loop" if error.errno == errno.ELOOP else f"unreadable ({error.strerror})"
    if stat.S_ISREG(mode):
        return None
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")]
    kind = next((name for test, name in kinds if test(mode)), "a special file")
    return f"{kind}, not a regular file"


def _load(path: Path, shown: str, loaded: LoadedFile) -> LoadedFile:
    try:
        problem = _not_a_regular_file(path)
        if problem is not None:
            raise SpecError(f"cannot be read: {problem}", path=shown)
        size_bytes = path.stat().st_size  # checked before reading: a huge file is never loaded
        if size_bytes > MAX_FILE_BYTES:
            raise SpecError(f"file is {size_bytes} bytes; claims files may be at most {MAX_FILE_BYTES}", path=shown)
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            line = raw[: error.start].count(b"\n") + 1
            raise SpecError(f"file is not UTF-8 text: {error.reason} at byte {error.start}", path=shown, line=line) from None
        root = compose(text, shown)
        if root is None:
            raise SpecError("file is empty; expected keys 'area', 'source' and 'claims'", path=shown, line=1)
        if not isinstance(root, yaml.MappingNode):
            raise SpecError("top level must be a mapping with keys 'area', 'source' and 'claims'", path=shown, line=root.start_mark.line + 1)
        data = _header_data(root, shown)
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
    for claim_node in claims_node.value:
        line = claim_node.start_mark.line + 1
        claim_id = _raw_id(claim_node) or f"#{len(loaded.claims) + len(loaded.errors) + 1}"
        try:
            claim_data = to_python(claim_node, shown)  # one claim's bad value costs that claim only
            loaded.claims.append(_load_claim(claim_data, claim_node, shown, line, header))
        except SpecError as error:
            error = SpecError(error.problem, path=shown, line=error.line or line, claim_id=claim_id)
            loaded.errors.append(error)
        except Exception as error:  # a loader bug costs this claim only
            problem = f"could not be loaded ({_one_line(error)}); please report this as a resacct bug"
            loaded.errors.append(SpecError(problem, path=shown, line=line, claim_id=claim_id))
    return loaded


def _header_data(root: yaml.MappingNode, path: str) -> dict[Any, Any]:
    """The top-level mapping as Python data, except that a ``claims`` list keeps its claims as
    nodes: each claim is converted on its own, so one bad value costs one claim."""
    claims_value = next((value for key, value in root.value if isinstance(key, yaml.ScalarNode) and key.value == "claims"), None)
    if not isinstance(claims_value, yaml.SequenceNode) or claims_value.tag != "tag:yaml.org,2002:seq" or is_refused(claims_value):
        return to_python(root, path)
    placeholder = yaml.SequenceNode("tag:yaml.org,2002:seq", [], claims_value.start_mark, claims_value.end_mark)
    data = to_python(yaml.MappingNode(root.tag, [(key, placeholder if value is claims_value else value) for key, value in root.value], root.start_mark, root.end_mark), path)
    data["claims"] = list(claims_value.value)
    return data


def _raw_id(node: yaml.Node) -> str | None:
    """The claim's ``id`` as written (before any conversion), cut to 40 characters."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "id" and isinstance(value, yaml.ScalarNode):
                return value.value if len(value.value) <= 40 else value.value[:39] + "…"
    return None


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
    if claim.expect is not None and claim.expect.raises is not None:
        problem = _unknown_exception(claim.expect.raises.type)
        if problem:
            raise SpecError(problem, line=key_lines.get("expect", line))
    for name, strategy in claim.forall.items():
        try:
            get_strategy(strategy)
        except ResacctError as error:
            raise SpecError(f"forall.{name}: {error}", line=key_lines.get("forall", line)) from None
    if claim.truth:
        from resacct.harness.schema import truth_template_names

        quoted = sorted(truth_template_names(claim.truth) - {"measured"} - set(check.quantities) - inputs)
        if quoted:
            raise SpecError(f"truth quotes {{{quoted[0]}}}, which is neither 'measured', an input nor a quantity measured by "
                            f"{check.name!r} (quantities: {', '.join(check.quantities) or 'none'})", line=key_lines.get("truth", line))
    if law is not None:
        known = inputs | set(check.quantities) | set(_defaults(check))
        unknown_names = sorted(law.names - known)
        if unknown_names:
            raise SpecError(
                f"law names {unknown_names[0]!r}, which is neither an input nor a quantity measured by {check.name!r} "
                f"(known: {', '.join(sorted(known)) or 'none'})",
                line=key_lines.get("law", line),
            )


# Exception classes a check may raise before their module is imported (resacct's own, and the
# libraries the checks call); every class already defined in this process is known as well.
_EXCEPTIONS_NOT_YET_IMPORTED = (
    "ResacctError", "SpecError", "LawError", "UnknownNameError", "CheckpointError", "HyperparameterError", "UserCodeError",
    "DistributedError", "DistributedUnavailableError", "DistributedRankError", "DistributedTimeoutError",
    "TypeCheckError", "BeartypeCallHintViolation", "BeartypeCallHintParamViolation", "BeartypeCallHintReturnViolation",
    "OutOfMemoryError", "AcceleratorError",
)


def _unknown_exception(type_name: str) -> str | None:
    """Why ``expect.raises.type`` names no exception class (a typo would make the claim fail, or a
    refuted one pass, for the wrong reason); None when it names one. ``module.Name`` is judged by
    ``Name``, as the evaluator matches either form."""
    import builtins
    import difflib

    suggested = {name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)}
    suggested.update(_EXCEPTIONS_NOT_YET_IMPORTED)
    known, pending, seen = set(suggested), [BaseException], set()
    while pending:  # every exception class defined so far (the check's module is imported by now)
        cls = pending.pop()
        if cls not in seen:
            seen.add(cls)
            known.add(cls.__name__)
            pending.extend(type.__subclasses__(cls))
    if type_name.rpartition(".")[2] in known:
        return None
    close = difflib.get_close_matches(type_name.rpartition(".")[2], sorted(suggested), n=1)  # not from whatever is imported: the same hint everywhere
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (f"expect.raises.type {shown(type_name, 60)} is not a known exception class{hint} "
            f"(expected a builtin such as ValueError, a resacct error, or a class the check's module defines)")


_PLAIN_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,)}


def _check_given_types(check: Any, claim: Claim, line: int) -> None:
    """A given value must have the plain type the check's parameter is annotated with."""
    try:
        hints = check.type_hints()
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
