"""Pure: Kubernetes DRA device selectors (CEL) evaluated on Tessera's devices.

A selector (``CELDeviceSelector.expression`` in a DeviceClass or a claim's request) sees one
``device``, as ``k8s.io/dynamic-resource-allocation/cel`` presents it:

- ``device.driver`` (string), ``device.allowMultipleAllocations`` (bool);
- ``device.attributes["<domain>"].<name>``: bool, int, string, or a semver value for a
  ``version`` attribute; ``device.capacity["<domain>"].<name>``: a quantity. An unknown domain is
  an empty map; an unknown name is an evaluation error (``has()`` or ``in`` test for it);
- Kubernetes' quantity library (``quantity``, ``isQuantity``, and on a quantity ``compareTo``,
  ``isGreaterThan``, ``isLessThan``, ``add``, ``sub``, ``asInteger``, ``asApproximateFloat``,
  ``isInteger``, ``sign``; ``==`` compares amounts) and semver library (``semver``,
  ``isSemver``, ``major``, ``minor``, ``patch``, ``compareTo``, ``isGreaterThan``,
  ``isLessThan``), plus ``lowerAscii`` and ``upperAscii`` of the strings library.

The evaluator is cel-python (``celpy``), a maintained CEL implementation: it parses and runs
standard CEL (macros ``has``, ``all``, ``exists``, ``exists_one``, ``map``, ``filter``;
``matches``, ``startsWith``...), and this module adds the Kubernetes libraries above. What it
cannot evaluate (``cel.bind``, the rest of the strings library, optional values, another
library's function) is a :class:`SelectorProblem` saying so, never a guess: the device does not
match and the reason reaches the pod. So is a result that is not a bool, as Kubernetes refuses
it. Not modelled: the API server's cost limit (``CELSelectorExpressionMaxCost``).

:func:`reads_model_only` tells, from the parsed expression, whether a selector reads nothing of a
device but its driver and model: the placer judges those by model, the others GPU by GPU.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final

import celpy
import msgspec
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, base_functions

from shared.dra.devices import MODEL, DeviceDescription, Version, qualified
from shared.quantity import QuantityError, parse_quantity

_SEMVER: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_UNDECLARED: Final = re.compile(r"undeclared reference to '([^']+)'")


class SelectorProblem(msgspec.Struct, frozen=True, kw_only=True):
    """Why a selector cannot be evaluated (or cannot be on this device)."""

    expression: str
    problem: str

    def __str__(self) -> str:
        return f"selector {self.expression!r}: {self.problem}"


class _LibraryError(Exception):
    """A Kubernetes library function was called on what it does not take."""


class Quantity:
    """A Kubernetes quantity in CEL: an exact amount (``resource.Quantity``)."""

    __slots__ = ("amount",)

    def __init__(self, amount: Fraction) -> None:
        self.amount = amount

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def __repr__(self) -> str:
        return f"quantity({self.amount})"


class Semver:
    """A semantic version in CEL (``semver("1.2.3")``, a ``version`` attribute)."""

    __slots__ = ("key", "text")

    def __init__(self, text: str) -> None:
        match = _SEMVER.match(text)
        if match is None:
            raise _LibraryError(f"{text!r} is not a semantic version")
        self.text = text
        major, minor, patch, pre, _ = match.groups()
        # semver 2.0.0 precedence: a pre-release sorts before its release; numeric identifiers
        # numerically and before alphanumeric ones; build metadata does not count.
        parts: tuple[tuple[int, int, str], ...] = tuple(
            (0, int(p), "") if p.isdigit() else (1, 0, p) for p in (pre or "").split(".") if p
        )
        self.key = (int(major), int(minor), int(patch), 0 if pre else 1, parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"semver({self.text!r})"


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(parse_quantity(str(text)))
    except QuantityError:
        raise _LibraryError(f"{str(text)!r} is not a quantity") from None


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        parse_quantity(str(text))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _is_semver(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_SEMVER.match(str(text)) is not None)


def _amount(value: Any) -> Fraction:
    if isinstance(value, Quantity):
        return value.amount
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(value)
    raise _LibraryError(f"{value!r} is not a quantity or an integer")


def _order(left: Any, right: Any) -> int:
    if isinstance(left, Quantity) and isinstance(right, Quantity):
        return (left.amount > right.amount) - (left.amount < right.amount)
    if isinstance(left, Semver) and isinstance(right, Semver):
        return (left.key > right.key) - (left.key < right.key)
    raise _LibraryError(
        f"cannot compare {type(left).__name__} with {type(right).__name__}: both must be "
        "quantities or both semantic versions"
    )


def _semver_part(index: int) -> Callable[[Any], celtypes.IntType]:
    def part(value: Any) -> celtypes.IntType:
        if not isinstance(value, Semver):
            raise _LibraryError(f"{value!r} is not a semantic version")
        return celtypes.IntType(value.key[index])

    return part


def _as_integer(value: Any) -> celtypes.IntType:
    amount = _amount(value)
    if amount.denominator != 1 or not -(2**63) <= amount < 2**63:
        raise _LibraryError(f"{value!r} is not an integer within int64")
    return celtypes.IntType(int(amount))


def _ascii(convert: Callable[[str], str]) -> Callable[[Any], celtypes.StringType]:
    def apply(value: Any) -> celtypes.StringType:
        if not isinstance(value, str):
            raise _LibraryError(f"{value!r} is not a string")
        return celtypes.StringType("".join(convert(c) if c.isascii() else c for c in value))

    return apply


FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": lambda text: Semver(str(text)),
    "isSemver": _is_semver,
    "compareTo": lambda left, right: celtypes.IntType(_order(left, right)),
    "isGreaterThan": lambda left, right: celtypes.BoolType(_order(left, right) > 0),
    "isLessThan": lambda left, right: celtypes.BoolType(_order(left, right) < 0),
    "add": lambda left, right: Quantity(_amount(left) + _amount(right)),
    "sub": lambda left, right: Quantity(_amount(left) - _amount(right)),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda value: celtypes.DoubleType(float(_amount(value))),
    "isInteger": lambda value: celtypes.BoolType(_amount(value).denominator == 1),
    "sign": lambda value: celtypes.IntType((_amount(value) > 0) - (_amount(value) < 0)),
    "major": _semver_part(0),
    "minor": _semver_part(1),
    "patch": _semver_part(2),
    "lowerAscii": _ascii(str.lower),
    "upperAscii": _ascii(str.upper),
}
"""Kubernetes' CEL libraries, by name: celpy calls ``x.f(y)`` as ``f(x, y)``."""


class _Domains(celtypes.MapType):
    """``device.attributes`` and ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if key not in self:
            return celtypes.MapType({})
        return super().__getitem__(key)


def _value(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, Version):
        return Semver(value.text)
    return celtypes.StringType(value)


def _by_domain(values: dict[str, Any], convert: Callable[[Any], Any]) -> _Domains:
    domains: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        domain, _, short = name.rpartition("/")
        domains.setdefault(domain, {})[short] = convert(value)
    return _Domains(
        {
            celtypes.StringType(domain): celtypes.MapType(
                {celtypes.StringType(k): v for k, v in entries.items()}
            )
            for domain, entries in domains.items()
        }
    )


def activation(device: DeviceDescription) -> dict[str, Any]:
    """The CEL variables for one device."""
    return {
        "device": celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(device.driver),
                celtypes.StringType("attributes"): _by_domain(device.attributes, _value),
                celtypes.StringType("capacity"): _by_domain(device.capacity, Quantity),
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                    device.allow_multiple_allocations
                ),
            }
        )
    }


class Selector:
    """One compiled selector."""

    def __init__(self, expression: str, program: Any) -> None:
        self.expression = expression
        self._program = program

    def matches(self, device: DeviceDescription) -> bool | SelectorProblem:
        """Whether ``device`` satisfies the selector, or why it cannot be evaluated on it."""
        return self.evaluate(activation(device))

    def evaluate(self, variables: dict[str, Any]) -> bool | SelectorProblem:
        """:meth:`matches` on variables made once by :func:`activation` (for many selectors)."""
        try:
            result = self._program.evaluate(variables)
        except CELEvalError as error:
            return self._problem(error)
        except _LibraryError as error:
            return SelectorProblem(expression=self.expression, problem=str(error))
        if isinstance(result, CELEvalError):
            return self._problem(result)
        if not isinstance(result, celtypes.BoolType):
            return SelectorProblem(
                expression=self.expression,
                problem=f"evaluates to {type(result).__name__.removesuffix('Type').lower()}, "
                "not bool",
            )
        return bool(result)

    def _problem(self, error: CELEvalError) -> SelectorProblem:
        cause = error.__cause__
        if isinstance(cause, _LibraryError):
            return SelectorProblem(expression=self.expression, problem=str(cause))
        text = str(error.args[0]) if error.args else str(error)
        undeclared = _UNDECLARED.search(text)
        if undeclared:
            name = undeclared.group(1)
            text = (
                f"{name} is not a function or variable Tessera's CEL evaluator knows"
                if name != "device"
                else text
            )
        elif "no such key" in text and len(error.args) > 2 and error.args[2]:
            text = f"no such key: {error.args[2][0]}"
        elif "no such member" in text:
            text = text.split(" (in activation", 1)[0]
        return SelectorProblem(expression=self.expression, problem=f"cannot evaluate: {text}")


@functools.cache
def _environment() -> celpy.Environment:
    """celpy's environment, made at the first compile: making it builds a Lark parser of CEL's
    grammar (0.1-0.2 s of CPU), which every placer, binder and device plugin paid at start
    although only DRA selectors need it."""
    return celpy.Environment()


_MACROS: Final = frozenset({"has", "all", "exists", "exists_one", "map", "filter", "dyn"})
KNOWN_FUNCTIONS: Final = frozenset(base_functions) | frozenset(FUNCTIONS) | _MACROS
"""Every function and macro a selector may call here."""


def _unknown_functions(tree: Any) -> list[str]:
    """Functions the expression calls that no library here defines (``x.f()``, ``f()``)."""
    called = []
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg":
            called.append(str(node.children[1]))
        elif node.data == "ident_arg":
            called.append(str(node.children[0]))
    return sorted({name for name in called if name not in KNOWN_FUNCTIONS})


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector | SelectorProblem:
    """The selector ready to evaluate, or why the expression does not parse. Cached: a burst of
    identical claims repeats a few expressions."""
    try:
        tree = _environment().compile(expression)
    except CELParseError as error:
        near = str(error).strip().splitlines()
        detail = f" near {near[0].strip()!r}" if near else ""
        return SelectorProblem(
            expression=expression, problem=f"is not valid CEL (syntax error{detail})"
        )
    unknown = _unknown_functions(tree)
    if unknown:
        return SelectorProblem(
            expression=expression,
            problem=f"cannot be evaluated: Tessera's CEL evaluator does not implement "
            f"{', '.join(unknown)}",
        )
    return Selector(expression, _environment().program(tree, functions=FUNCTIONS))


_MODEL_PATHS: Final = frozenset(
    {
        ("device", "driver"),
        ("device", "allowMultipleAllocations"),
        ("device", "attributes", *qualified(MODEL).rsplit("/", 1)),
    }
)
"""What a selector may read of a device and still be judged on a GPU's model alone: the same
for every device of one model (the driver's name, the model)."""


def _is_tree(node: Any, data: str | None = None) -> bool:
    """Whether ``node`` is a parse tree node (of rule ``data``), not a token."""
    return hasattr(node, "children") and (data is None or node.data == data)


def _literal(tree: Any) -> str | None:
    """The plain string literal ``tree`` (an index expression) is, else None."""
    while _is_tree(tree) and tree.data != "literal" and len(tree.children) == 1:
        tree = tree.children[0]
    if not _is_tree(tree, "literal"):
        return None
    text = str(tree.children[0])
    if len(text) < 2 or text[0] not in "\"'" or text[-1] != text[0] or "\\" in text:
        return None  # raw, bytes, triple-quoted or escaped: not worth decoding here
    body = text[1:-1]
    return None if text[0] in body else body


def _device_path(member: Any) -> tuple[str | None, ...] | None:
    """The chain of field and index selections ``member`` makes from ``device`` (an index not
    a plain string literal is None), or None when it does not start at ``device``."""
    node = member.children[0]
    if node.data == "primary":
        ident = node.children[0]
        if _is_tree(ident, "ident") and str(ident.children[0]) == "device":
            return ("device",)
        return None
    if node.data not in ("member_dot", "member_index"):
        return None
    head = _device_path(node.children[0])
    if head is None:
        return None
    if node.data == "member_dot":
        return (*head, str(node.children[1]))
    return (*head, _literal(node.children[1]))


Path = tuple[str, ...]
"""What a selector reads of a device: ``("device", "driver")``,
``("device", "attributes", "<domain>", "<name>")``, ``("device", "capacity", ...)``."""
_CONSTANT: Final = frozenset({"driver", "allowMultipleAllocations"})


def _read(path: tuple[str | None, ...]) -> Path | None:
    """The value ``path`` (from :func:`_device_path`) reads, when it names one in full with
    plain strings (what follows it is evaluated on that value alone); else None."""
    if None in path or len(path) < 2:
        return None
    if path[1] in _CONSTANT:
        return ("device", str(path[1]))
    if path[1] in ("attributes", "capacity") and len(path) >= 4:
        return tuple(str(p) for p in path[:4])
    return None


def _reads(tree: Any, found: set[Path]) -> bool:
    if not _is_tree(tree):
        return True
    if tree.data == "member":
        path = _device_path(tree)
        if path is not None:
            read = _read(path)
            if read is None:
                return False
            found.add(read)
            return True
    return all(_reads(child, found) for child in tree.children)


@functools.lru_cache(maxsize=1024)
def reads(expression: str) -> frozenset[Path] | None:
    """Every value of a device ``expression`` reads, each named in full
    (``device.attributes["gpu.tessera.dev"].index``), so that it gives the same answer on any
    two devices with the same values there (present or not); None when it reads anything else
    (a whole map: ``device.attributes["gpu.tessera.dev"].exists(...)``, an index that is not a
    plain string, ``device`` itself), or does not compile."""
    try:
        tree = _environment().compile(expression)
    except CELParseError:
        return None
    found: set[Path] = set()
    return frozenset(found) if _reads(tree, found) else None


def reads_model_only(expression: str) -> bool:
    """Whether ``expression`` reads nothing of a device but its driver and ``model`` attribute
    (:func:`reads`), so that it gives the same answer on every GPU of one model: such a
    selector is judged by model, any other GPU by GPU."""
    found = reads(expression)
    return found is not None and found <= _MODEL_PATHS


def select(expressions: tuple[str, ...], device: DeviceDescription) -> bool | SelectorProblem:
    """Whether ``device`` satisfies every expression (Kubernetes ANDs them), or the first
    reason one cannot be evaluated."""
    if not expressions:
        return True
    variables = activation(device)
    for expression in expressions:
        selector = compile_selector(expression)
        if isinstance(selector, SelectorProblem):
            return selector
        verdict = selector.evaluate(variables)
        if verdict is not True:
            return verdict
    return True
