"""What the service can write to a log line, read from its source (an AST scan, not a
copy of the strings): the messages and field values of every `logger.<level>(...)` call
and of `log_unexpected(...)`, the `log=` and `fields=` of the verdicts the conclusion logs,
and the log column of `lib.archive.conclusion.CONCLUSIONS`.

A text is a template: literal parts and holes (`None`) where a value is filled in at run
time. A name in an f-string is followed to the strings it can hold: assignments in its
function or module, a parameter's arguments at the calls in its module and in the modules
that import the function, a function's returns, names imported from `lib`. What cannot
be followed stays a hole."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tests.docs.markdown import ROOT

SRC = ROOT / "src"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
Template = tuple[str | None, ...]
HOLE: Template = (None,)
MAX_DEPTH = 8
MAX_TEMPLATES = 400


@dataclass
class Module:
    name: str
    tree: ast.Module
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local -> (module, name)

    def __post_init__(self) -> None:
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lib"):
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The function (or the module) a node is in."""
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                return node
        return self.tree

    def function(self, name: str) -> ast.FunctionDef | None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        return None


@cache
def modules() -> dict[str, Module]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        found[name] = Module(name, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def _product(parts: list[list[Template]]) -> list[Template]:
    combos = []
    for combo in itertools.islice(itertools.product(*parts), MAX_TEMPLATES):
        merged: list[str | None] = []
        for piece in itertools.chain.from_iterable(combo):
            if piece is not None and merged and merged[-1] is not None:
                merged[-1] += piece
            elif not (piece is None and merged and merged[-1] is None):
                merged.append(piece)
        combos.append(tuple(merged))
    return combos


class Resolver:
    """Follows an expression to the templates it can produce."""

    def __init__(self) -> None:
        self.modules = modules()

    def texts(self, node: ast.AST, module: Module, depth: int = 0) -> list[Template]:
        if depth > MAX_DEPTH:
            return [HOLE]
        found = self._texts(node, module, depth + 1)
        return list(dict.fromkeys(found))[:MAX_TEMPLATES] or [HOLE]

    def _texts(self, node: ast.AST, module: Module, depth: int) -> list[Template]:
        match node:
            case ast.Constant(value=str(value)):
                return [(value,)]
            case ast.JoinedStr(values=values):
                return _product([self.texts(value, module, depth) for value in values])
            case ast.FormattedValue(value=value):
                return self.texts(value, module, depth)
            case ast.BinOp(left=left, op=ast.Add(), right=right):
                return _product([self.texts(left, module, depth), self.texts(right, module, depth)])
            case ast.IfExp(body=body, orelse=orelse):
                return self.texts(body, module, depth) + self.texts(orelse, module, depth)
            case ast.BoolOp(values=values):
                return [t for value in values for t in self.texts(value, module, depth)]
            case ast.Tuple(elts=elements) | ast.List(elts=elements):
                return [t for value in elements for t in self.texts(value, module, depth)]
            case ast.Starred(value=value):
                return self.texts(value, module, depth)
            case ast.Name(id=name):
                return self._name(name, node, module, depth)
            case ast.Call(func=ast.Name(id="str"), args=[ast.Name(id=name)]):
                return self._raised(name, node, module, depth)
            case ast.Call(func=ast.Name(id=name)):
                return self._returns(name, module, depth)
        return [HOLE]

    def _raised(self, name: str, node: ast.AST, module: Module, depth: int) -> list[Template]:
        """`str(error)` inside `except X as error`: what the code raises X with."""
        handler = node
        while handler in module.parents and not (
            isinstance(handler, ast.ExceptHandler) and handler.name == name
        ):
            handler = module.parents[handler]
        if not isinstance(handler, ast.ExceptHandler) or not isinstance(handler.type, ast.Name):
            return [HOLE]
        raised = [
            (call.args[0], where)
            for where in self.modules.values()
            for call in _raises(where, handler.type.id)
            if call.args
        ]
        return [t for arg, where in raised for t in self.texts(arg, where, depth)] or [HOLE]

    def _name(self, name: str, node: ast.AST, module: Module, depth: int) -> list[Template]:
        scope = module.scope_of(node)
        values = list(_assigned(scope, name)) + list(_looped(scope, name))
        if values:
            return [t for value in values for t in self.texts(value, module, depth)]
        if isinstance(scope, ast.FunctionDef) and name in _parameters(scope):
            arguments = [
                found
                for caller, called in self._callers(module, scope)
                for found in _arguments(caller, scope, name, called)
            ]
            return [t for arg, where in arguments for t in self.texts(arg, where, depth)] or [HOLE]
        values = list(_assigned(module.tree, name))
        if values:
            return [t for value in values for t in self.texts(value, module, depth)]
        if name in module.imports:
            source, original = module.imports[name]
            if source in self.modules:
                other = self.modules[source]
                values = list(_assigned(other.tree, original))
                return [t for value in values for t in self.texts(value, other, depth)] or [HOLE]
        return [HOLE]

    def _callers(self, module: Module, function: ast.FunctionDef) -> Iterator[tuple[Module, str]]:
        """The modules that can call `function`, and the name each calls it by: its own,
        and those that import it from `module`."""
        yield module, function.name
        for other in self.modules.values():
            for local, (source, original) in other.imports.items():
                if source == module.name and original == function.name:
                    yield other, local

    def _returns(self, name: str, module: Module, depth: int) -> list[Template]:
        where, function = module, module.function(name)
        if function is None and name in module.imports:
            source, original = module.imports[name]
            if source in self.modules:
                where = self.modules[source]
                function = where.function(original)
        if function is None:
            return [HOLE]
        returns = [
            node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Return) and node.value is not None
        ]
        return [t for value in returns for t in self.texts(value, where, depth)] or [HOLE]


def _assigned(scope: ast.AST, name: str) -> Iterator[ast.AST]:
    """The values `name` is assigned in `scope` itself (not in nested functions)."""
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name:
                    yield node.value
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for element, value in zip(target.elts, node.value.elts, strict=False):
                        if isinstance(element, ast.Name) and element.id == name:
                            yield value


def _looped(scope: ast.AST, name: str) -> Iterator[ast.AST]:
    """The elements of a literal `for name in (...)` in `scope`."""
    for node in _own_nodes(scope):
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and isinstance(node.iter, ast.Tuple | ast.List)
        ):
            for element in node.iter.elts:
                yield element.value if isinstance(element, ast.Starred) else element


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def _parameters(function: ast.FunctionDef) -> list[str]:
    args = function.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _arguments(
    module: Module, function: ast.FunctionDef, name: str, called: str
) -> Iterator[tuple[ast.AST, Module]]:
    """What the calls of `function` (`called` in `module`) pass as `name`."""
    positional = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Call) and _called(node) == called:
            for keyword in node.keywords:
                if keyword.arg == name:
                    yield keyword.value, module
            if name in positional and positional.index(name) < len(node.args):
                yield node.args[positional.index(name)], module


def _raises(module: Module, error: str) -> Iterator[ast.Call]:
    for node in ast.walk(module.tree):
        exc = node.exc if isinstance(node, ast.Raise) else None
        if isinstance(exc, ast.Call) and _called(exc) == error:
            yield exc


def _called(call: ast.Call) -> str | None:
    match call.func:
        case ast.Name(id=name):
            return name
        case ast.Attribute(attr=name):
            return name
    return None


def _is_logger_call(call: ast.Call, module: Module) -> bool:
    """`logger.info(...)`, `log_unexpected(...)`, or a name bound to a logger method."""
    match call.func:
        case ast.Attribute(value=ast.Name(id="logger"), attr=level):
            return level in LEVELS
        case ast.Name(id="log_unexpected"):
            return True
        case ast.Name(id=name):
            bound = _assigned(module.scope_of(call), name)
            return any("logger" in ast.unparse(value) for value in bound)
    return False


def _sinks(module: Module) -> Iterator[ast.AST]:
    """The expressions whose value can end up in a log line."""
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Call):
            continue
        if _is_logger_call(node, module):
            yield from node.args
            yield from (keyword.value for keyword in node.keywords)
        for keyword in node.keywords:
            if keyword.arg == "log":
                yield keyword.value
            elif keyword.arg == "fields" and isinstance(keyword.value, ast.Dict):
                yield from keyword.value.values


@cache
def logged() -> tuple[Template, ...]:
    """Every template a log line's message or field can hold."""
    from lib.archive.conclusion import CONCLUSIONS

    resolver = Resolver()
    found: list[Template] = [(rule.log,) for rule in CONCLUSIONS.values()]
    for module in resolver.modules.values():
        for sink in _sinks(module):
            found += resolver.texts(sink, module)
    return tuple(dict.fromkeys(t for t in found if any(t)))


@cache
def metric_names() -> frozenset[str]:
    """Every EMF metric the code can count: `add_metric(name=...)`, the `metrics=` a
    verdict carries, and the metric column of CONCLUSIONS. What only passes a verdict's
    metrics on (`verdict.metrics`) adds nothing of its own."""
    from lib.archive.conclusion import CONCLUSIONS

    resolver = Resolver()
    found = {rule.metric for rule in CONCLUSIONS.values() if rule.metric}
    for module in resolver.modules.values():
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Call):
                continue
            named = [k.value for k in node.keywords if k.arg == "name"]
            if _called(node) == "add_metric" and named:
                sources = named
            else:
                sources = [k.value for k in node.keywords if k.arg == "metrics"]
            for source in sources:
                found |= {
                    "".join(piece for piece in template if piece)
                    for template in resolver.texts(source, module)
                    if None not in template
                }
    return frozenset(found)


ELLIPSIS = ("…", "...")


def emitted(phrase: str) -> bool:
    """Whether some log line can contain `phrase`: its parts (an ellipsis stands for any
    text) in order, each within one literal part of a template."""
    for mark in ELLIPSIS[1:]:
        phrase = phrase.replace(mark, ELLIPSIS[0])
    parts = [part for part in phrase.split(ELLIPSIS[0]) if part.strip()]
    for template in logged():
        text = "\0".join("" if piece is None else piece for piece in template)
        position = 0
        for part in parts:
            position = text.find(part, position)
            if position < 0:
                break
            position += len(part)
        else:
            return bool(parts)
    return False


def source_files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))
