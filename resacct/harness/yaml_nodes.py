"""YAML text → PyYAML nodes → plain Python data, for claims files, with every hostile input a
:class:`SpecError` on its line: no anchors or aliases (no billion laughs: an alias is never
expanded, and the node that holds an anchor or alias is refused when it is converted, so only
its claim is lost), no tags beyond plain scalars and collections, no value its tag cannot build
(``!!int abc``), no integer over MAX_INTEGER_DIGITS digits (Python refuses more than 4,300), no
nesting deeper than MAX_NESTING (PyYAML's composer recurses per level and its scanner is
quadratic in flow depth). Tabs are read as libyaml reads them: fine in quoted strings, comments,
block scalars and between tokens; a tab in indentation is not YAML and refuses the file.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from resacct.errors import SpecError

__all__ = ["compose", "to_python", "is_refused", "shown", "MAX_NESTING", "MAX_INTEGER_DIGITS"]

MAX_NESTING = 32  # a claims file needs about 6 levels (claims → claim → given → list → list)
MAX_INTEGER_DIGITS = 400  # as for laws (resacct.harness.laws.MAX_MAGNITUDE); Python refuses > 4300 anyway

_SCALARS = yaml.constructor.SafeConstructor()  # builds ints, floats, bools, strings from resolved scalar nodes

_ALLOWED_TAGS = {
    "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq",
}


def shown(value: Any, limit: int = 40) -> str:
    """``repr`` of a value echoed in a message, cut to about ``limit`` characters (a 400-digit number is not echoed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"<integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "…" + text[-3:]


_TAG_MEANS = {
    "tag:yaml.org,2002:int": "!!int but is not an integer",
    "tag:yaml.org,2002:float": "!!float but is not a number",
    "tag:yaml.org,2002:bool": "!!bool but is not one of true, false, yes, no, on, off",
    "tag:yaml.org,2002:null": "!!null but is not null, ~ or empty",
}


def _scalar(node: yaml.ScalarNode, path: str, line: int) -> Any:
    """A scalar node's value; a value its tag cannot build (``!!int abc``) or an integer too long is one SpecError."""
    if node.tag == "tag:yaml.org,2002:int":
        digits = len(node.value.lstrip("+-").replace("_", ""))
        if digits > MAX_INTEGER_DIGITS:
            raise SpecError(f"integer {shown(node.value, 30)} has {digits} digits; at most {MAX_INTEGER_DIGITS} are allowed", path=path, line=line)
    try:
        return _SCALARS.construct_object(node, deep=True)
    except (ValueError, KeyError, TypeError, OverflowError, yaml.YAMLError):
        meaning = _TAG_MEANS.get(node.tag, f"{node.tag} but cannot be read as one")
        raise SpecError(f"value {shown(node.value)} is tagged {meaning}", path=path, line=line) from None


def is_refused(node: yaml.Node) -> bool:
    """Whether :func:`to_python` refuses this very node (it holds an anchor, or is an alias)."""
    return getattr(node, _REFUSED, None) is not None


def to_python(node: yaml.Node, path: str) -> Any:
    """Plain Python data from a composed node; refuses aliases, duplicate keys and foreign tags."""
    line = node.start_mark.line + 1
    refused = getattr(node, _REFUSED, None)  # an anchor or alias, kept by the composer for this moment
    if refused is not None:
        raise SpecError(refused, path=path, line=line)
    if node.tag not in _ALLOWED_TAGS:
        raise SpecError(f"YAML tag {node.tag!r} is not allowed; claims hold plain strings, numbers, lists and mappings", path=path, line=line)
    if isinstance(node, yaml.ScalarNode):
        return _scalar(node, path, line)
    if isinstance(node, yaml.SequenceNode):
        return [to_python(child, path) for child in node.value]
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = to_python(key_node, path)
            if not isinstance(key, (str, int, float, bool)):
                raise SpecError(f"mapping keys must be plain words, got {key!r}", path=path, line=key_node.start_mark.line + 1)
            if key in result:
                raise SpecError(f"duplicate key {key!r}", path=path, line=key_node.start_mark.line + 1)
            result[key] = to_python(value_node, path)
        return result
    raise SpecError(f"unsupported YAML node {type(node).__name__}", path=path, line=line)


_REFUSED = "resacct_refused"  # attribute of a node that to_python must refuse (with this message)
_LINE_BREAKS = "\0\r\n\x85\u2028\u2029"


class _NoAliasComposer(yaml.SafeLoader):
    """Composes nodes, marking anchors and aliases for refusal without ever expanding an alias
    (bounded work and memory), refusing nesting deeper than MAX_NESTING (PyYAML's composer
    recurses once per level), and reading tabs as libyaml does (PyYAML refuses every tab outside
    quotes and comments; libyaml, the fast path, allows them between tokens)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102
        if self._depth >= MAX_NESTING and self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            event = self.peek_event()
            raise SpecError(f"lists and mappings nested more than {MAX_NESTING} levels deep; claims need a few", line=event.start_mark.line + 1)
        self._depth += 1
        try:
            return self._compose_plain_node(parent, index)
        finally:
            self._depth -= 1

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 (PyYAML's name)
        """Stop at the first ``[`` or ``{`` too deep: PyYAML's scanner is quadratic in flow depth."""
        if self.flow_level >= MAX_NESTING:
            raise SpecError(f"lists and mappings nested more than {MAX_NESTING} levels deep; claims need a few", line=self.get_mark().line + 1)
        super().fetch_flow_collection_start(TokenClass)

    def _compose_plain_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):  # never resolved: a placeholder its claim refuses
            event = self.get_event()
            node = yaml.ScalarNode("tag:yaml.org,2002:null", "", event.start_mark, event.end_mark)
            setattr(node, _REFUSED, f"YAML aliases (*{event.anchor}) are not allowed in claims files")
            return node
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if anchor is None:
            return super().compose_node(parent, index)
        event.anchor = None  # never registered, so no alias can reach it and no duplicate is an error
        node = super().compose_node(parent, index)
        setattr(node, _REFUSED, f"YAML anchors (&{anchor}) are not allowed in claims files")
        return node

    def scan_to_next_token(self) -> None:
        """PyYAML's, except that a tab is skipped where libyaml skips it: inside flow
        collections, and in block context where no key may start (so never as indentation)."""
        if self.index == 0 and self.peek() == "\uFEFF":
            self.forward()
        while True:
            while self.peek() == " " or (self.peek() == "\t" and (self.flow_level or not self.allow_simple_key)):
                self.forward()
            if self.peek() == "#":
                while self.peek() not in _LINE_BREAKS:
                    self.forward()
            if self.scan_line_break():
                if not self.flow_level:
                    self.allow_simple_key = True
            else:
                return

    def scan_plain_spaces(self, indent: int, start_mark: Any) -> Any:
        """Tabs between the words of a plain scalar (``says: a\tb``) belong to it, as in libyaml."""
        length = 0
        while self.peek(length) in " \t":
            length += 1
        if "\t" in self.prefix(length) and self.peek(length) not in _LINE_BREAKS:
            whitespace = self.prefix(length)
            self.forward(length)
            return [whitespace]
        return super().scan_plain_spaces(indent, start_mark)


# YAML 1.1 (PyYAML) reads 1e-8 and 3.4e38 as strings; claims mean numbers (as YAML 1.2 does).
EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_NoAliasComposer.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))


def _char(character: int | str) -> str:
    return repr(chr(character) if isinstance(character, int) else character)


class _FastComposer(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's scanner, parser and composer: about 15 times faster than the pure-Python ones on
    the shipped specs (0.05 s against 0.8 s for all of them). Used only where its result cannot
    differ; see :func:`compose`."""


_FastComposer.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))


_ANCHOR = re.compile(r"(?:^|[\s\[\]{},])&[^\s]")  # `&name` where a node may start ("R & D" is not one)


def _fast_compose(text: str) -> yaml.Node | None:
    """The node tree from libyaml, or None where the checked pure-Python path must decide: no
    libyaml, anything that may be an anchor (``&name``), any error, an alias (one node reached twice), or
    nesting deeper than MAX_NESTING. Those paths give the exact SpecError on its line."""
    if not getattr(yaml, "__with_libyaml__", False) or _ANCHOR.search(text):
        return None
    try:
        root = yaml.compose(text, Loader=_FastComposer)
    except Exception:  # noqa: BLE001 - any libyaml complaint: the pure-Python path words it
        return None
    if root is None:
        return None
    seen: set[int] = set()
    pending: list[tuple[yaml.Node, int]] = [(root, 1)]
    while pending:
        node, depth = pending.pop()
        if id(node) in seen:
            return None
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            continue
        if depth > MAX_NESTING:
            return None
        pending.extend((child, depth + 1) for child in children)
    return root


def compose(text: str, path: str) -> yaml.Node | None:
    fast = _fast_compose(text)
    if fast is not None:
        return fast
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
        if "'\\t'" in (error.problem or ""):  # the one place YAML forbids a tab: indentation
            raise SpecError("tab character; YAML indentation must use spaces", path=path, line=line) from None
        problem = " ".join(part for part in (error.context, error.problem) if part)
        raise SpecError(f"invalid YAML: {problem}", path=path, line=line) from None
    except yaml.reader.ReaderError as error:
        line = text[: error.position].count("\n") + 1
        raise SpecError(f"invalid YAML: unprintable character {_char(error.character)} at position {error.position}", path=path, line=line) from None
    except yaml.YAMLError as error:
        raise SpecError(f"invalid YAML: {error}", path=path) from None
    finally:
        loader.dispose()
