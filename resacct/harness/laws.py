"""Safe evaluation of laws: arithmetic over named inputs and measured quantities.

A law is data, never code. Allowed: numbers, names, ``+ - * / // % **``, unary ``-``/``+``,
parentheses, and list/tuple literals (``[cols, 1]`` for strides). Anything else — calls,
attribute access, subscripts, comparisons, strings, lambdas, dunders — is refused when the
spec is loaded, with a message naming what was found. Exponents are bounded, so
``10**10**10`` is refused rather than computed.

>>> Law.parse("2*m*k*n").evaluate({"m": 2, "k": 3, "n": 4})
48
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resacct.errors import LawError

__all__ = ["Law", "MAX_LAW_CHARS", "MAX_EXPONENT", "MAX_MAGNITUDE"]

MAX_LAW_CHARS = 500
MAX_EXPONENT = 128
MAX_MAGNITUDE = 10**400  # |intermediate results| beyond this are refused
MAX_DEPTH = 40

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}

_DESCRIBE = {
    ast.Call: "a function call",
    ast.Attribute: "attribute access",
    ast.Subscript: "subscripting",
    ast.Compare: "a comparison",
    ast.BoolOp: "a boolean operator",
    ast.Lambda: "a lambda",
    ast.IfExp: "a conditional expression",
    ast.Dict: "a dict",
    ast.Set: "a set",
    ast.ListComp: "a comprehension",
    ast.GeneratorExp: "a generator",
    ast.JoinedStr: "an f-string",
    ast.NamedExpr: "an assignment",
    ast.Starred: "unpacking",
}


@dataclass(frozen=True)
class Law:
    """A parsed, validated law. Build with :meth:`Law.parse`."""

    text: str
    tree: ast.Expression
    names: frozenset[str]

    @classmethod
    def parse(cls, text: str) -> Law:
        if not isinstance(text, str):
            raise LawError(f"a law must be a string of arithmetic, got {type(text).__name__} {text!r}")
        if len(text) > MAX_LAW_CHARS:
            raise LawError(f"law is {len(text)} characters long; at most {MAX_LAW_CHARS} are allowed")
        if not text.strip():
            raise LawError("law is empty; expected arithmetic such as '2*m*k*n'")
        foreign = next((character for character in text if not character.isascii()), None)
        if foreign is not None:  # Python reads 'ｍ' as 'm' (NFKC): a law must say what it computes
            raise LawError(f"law {_cut(text)} contains the non-ASCII character {foreign!r} (U+{ord(foreign):04X}); "
                           f"write names, numbers and operators in ASCII")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as error:
            raise LawError(f"law {text!r} is not valid arithmetic: {error.msg}") from None
        names: set[str] = set()
        _validate(tree.body, text, names, depth=0)
        return cls(text=text, tree=tree, names=frozenset(names))

    def evaluate(self, values: Mapping[str, Any]) -> Any:
        """The law's value for these inputs. Raises LawError (never anything else)."""
        missing = sorted(self.names - set(values))
        if missing:
            raise LawError(f"law {self.text!r} names {', '.join(missing)}, which no input or measured quantity provides")
        try:
            return _evaluate(self.tree.body, values, self.text)
        except LawError:
            raise
        except ZeroDivisionError:
            raise LawError(f"law {self.text!r} divides by zero{_for_inputs(values, self.names)}") from None
        except (OverflowError, TypeError, ValueError, RecursionError, MemoryError) as error:
            raise LawError(f"law {self.text!r} cannot be evaluated{_for_inputs(values, self.names)}: {error}") from None


def _for_inputs(values: Mapping[str, Any], names: frozenset[str]) -> str:
    shown = ", ".join(f"{name}={values[name]!r}" for name in sorted(names) if name in values)
    return f" for {shown}" if shown else ""


def _validate(node: ast.AST, text: str, names: set[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise LawError(f"law {text!r} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise LawError(f"law {text!r} contains the constant {node.value!r}; only numbers are allowed")
        if isinstance(node.value, int) and abs(node.value) > MAX_MAGNITUDE:
            raise LawError(f"law {_cut(text)} contains a number with more than 400 digits")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise LawError(f"law {_cut(text)} contains a number too large for a float (it reads as {node.value!r})")
        return
    if isinstance(node, ast.Name):
        if node.id.startswith("_"):
            raise LawError(f"law {text!r} uses the name {node.id!r}; names starting with '_' are not allowed")
        names.add(node.id)
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise LawError(f"law {text!r} uses the operator {type(node.op).__name__}; allowed: + - * / // % **")
        if isinstance(node.op, ast.Pow):
            _validate_exponent(node.right, text)
        _validate(node.left, text, names, depth + 1)
        _validate(node.right, text, names, depth + 1)
        return
    if isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise LawError(f"law {text!r} uses the operator {type(node.op).__name__}; allowed: unary - and +")
        _validate(node.operand, text, names, depth + 1)
        return
    if isinstance(node, (ast.List, ast.Tuple)):
        if not node.elts:
            raise LawError(f"law {text!r} contains an empty list; a list law needs at least one element, such as '[cols, 1]'")
        for element in node.elts:
            _validate(element, text, names, depth + 1)
        return
    what = _DESCRIBE.get(type(node), f"{type(node).__name__}")
    detail = ""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        detail = f" to {node.func.id!r}"
    elif isinstance(node, ast.Attribute):
        detail = f" of {node.attr!r}"
    raise LawError(f"law {text!r} contains {what}{detail}; only arithmetic over names and numbers is allowed")


def _validate_exponent(node: ast.AST, text: str) -> None:
    """Literal exponents must be small; a power of a power is refused outright."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        raise LawError(f"law {text!r} raises to a power of a power; at most one level of '**' is allowed")
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        node = node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and abs(node.value) > MAX_EXPONENT:
        raise LawError(f"law {text!r} has the exponent {node.value!r}; at most {MAX_EXPONENT} is allowed")


def _cut(text: str, limit: int = 80) -> str:
    """The law as quoted in a message, cut to about ``limit`` characters."""
    return repr(text if len(text) <= limit else text[: limit - 4] + "…" + text[-3:])


def _check_magnitude(value: Any, text: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_MAGNITUDE:
        raise LawError(f"law {text!r} produces a number with more than 400 digits")
    if isinstance(value, float) and math.isnan(value):
        raise LawError(f"law {text!r} produces NaN")
    if isinstance(value, float) and math.isinf(value):
        raise LawError(f"law {text!r} overflows: its value is beyond the float range (about 1.8e308)")
    if isinstance(value, complex):  # (-8)**0.5: Python answers with a complex number
        raise LawError(f"law {text!r} produces a complex number (a negative number to a fractional power); laws compute real numbers")
    return value


def _power_digits(base: Any, exponent: Any) -> float:
    """Roughly how many decimal digits ``base ** exponent`` has (0 when it is small or not numeric)."""
    if not isinstance(base, (int, float)) or not isinstance(exponent, (int, float)):
        return 0.0
    if abs(base) <= 1 or exponent <= 0:
        return 0.0
    return float(exponent) * math.log10(abs(base))


def _evaluate(node: ast.AST, values: Mapping[str, Any], text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        value = values[node.id]
        if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
            raise LawError(f"law {text!r} does arithmetic on {node.id}={value!r}, which is not a number")
        return value
    if isinstance(node, ast.UnaryOp):
        return _check_magnitude(_UNARY[type(node.op)](_evaluate(node.operand, values, text)), text)
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, values, text)
        right = _evaluate(node.right, values, text)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT:
            raise LawError(f"law {text!r} raises to the power {right!r}; at most {MAX_EXPONENT} is allowed")
        if isinstance(node.op, ast.Pow) and _power_digits(left, right) > 400:
            raise LawError(f"law {text!r} produces a number with more than 400 digits")
        if isinstance(left, (list, tuple)) or isinstance(right, (list, tuple)):
            raise LawError(f"law {text!r} does arithmetic on a list; lists may only appear as the whole result")
        return _check_magnitude(_BINARY[type(node.op)](left, right), text)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_evaluate(element, values, text) for element in node.elts]
    raise LawError(f"law {text!r} contains {type(node).__name__}")  # unreachable after _validate
