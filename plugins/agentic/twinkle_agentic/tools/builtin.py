"""The built-in tools: `Calculator` (name ``calculator``) and `PythonTool` (name ``python``), registered by this
distribution's entry points (group ``twinkle.tool``)."""

from __future__ import annotations

import ast
import math
import operator
import subprocess
import sys
from typing import Any, Callable

from twinkle_core.tool.base import Tool, ToolError
from twinkle_core.tool.decorator import validate_arguments

MAX_EXPRESSION_CHARS = 1000
MAX_NODES = 300
MAX_INT_BITS = 4096  # ~1233 decimal digits: larger integer results (and powers that would make one) are refused
# round(x, -k) of an int under MAX_INT_BITS bits (< 10**1234) is 0 for every k >= this; CPython computes 10**k first,
# so k is clamped here (same result): round(1, -10**7) would otherwise hold the GIL for seconds.
MIN_ROUND_DIGITS = -(math.ceil(MAX_INT_BITS * math.log10(2)) + 1)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {'sqrt': math.sqrt, 'abs': abs, 'round': round, 'min': min, 'max': max}
_CONSTANTS = {'pi': math.pi, 'e': math.e}


class Calculator(Tool):
    """Evaluates an arithmetic expression by walking its `ast` (never `eval`): int and float literals, + - * / // %
    **, unary + and -, parentheses, sqrt/abs/round/min/max and the constants pi and e. Refused, as `ToolError`:
    anything else (names, attributes, strings, ...), expressions over `MAX_EXPRESSION_CHARS` characters or
    `MAX_NODES` nodes, integers over `MAX_INT_BITS` bits (checked *before* a power or product is computed, so
    ``9**9**9`` costs nothing), division by zero, non-finite results. Integral results print without '.0'.

    Bounded work, so it runs in-process (``sandboxed = False``) and its timeout never has to stop it: every operand
    and result is an int under `MAX_INT_BITS` bits (a power or product at most twice that before it is refused) or a
    float, and ``round``'s digits are clamped at `MIN_ROUND_DIGITS`, so no operation costs more than a few
    big-integer steps on 8192-bit numbers, and an expression has at most `MAX_NODES` of them (milliseconds in all:
    tests/agentic/test_sandbox_isolation.py)."""

    name = 'calculator'
    description = (
        'Evaluate an arithmetic expression and return its value. Supports numbers, + - * / // % ** (power), '
        'parentheses, sqrt(x), abs(x), round(x[, digits]), min(...), max(...), pi and e.'
    )
    parameters = {
        'type': 'object',
        'properties': {'expression': {'type': 'string', 'description': 'The expression, e.g. "(3 + 4) * 2 ** 3"'}},
        'required': ['expression'],
    }
    timeout_s = 5.0
    sandboxed = False  # pure and bounded in work (see above): runs in-process

    def __call__(self, **arguments: Any) -> str:
        expression = validate_arguments(self.parameters, arguments, self.name)['expression']
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise ToolError(f'expression too long ({len(expression)} > {MAX_EXPRESSION_CHARS} characters)')
        try:
            tree = ast.parse(expression.strip(), mode='eval')
        except (SyntaxError, ValueError) as exc:
            raise ToolError(f'not an arithmetic expression: {expression!r} ({exc.__class__.__name__})') from None
        if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
            raise ToolError(f'expression too complex (more than {MAX_NODES} parts)')
        value = self._eval(tree.body)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ToolError('the result is not a finite number')
            return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f'{value:.15g}'
        return str(value)

    def _eval(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self._bounded(node.value)
        if isinstance(node, ast.Name) and node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = self._eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            self._check_size(node.op, left, right)
            try:
                return self._bounded(_BINARY[type(node.op)](left, right))
            except ZeroDivisionError:
                raise ToolError('division by zero') from None
            except OverflowError:
                raise ToolError('the result is too large') from None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            if node.keywords:
                raise ToolError(f'{node.func.id}() takes no keyword arguments')
            args = [self._eval(a) for a in node.args]
            if (
                node.func.id == 'round'
                and len(args) == 2
                and isinstance(args[1], int)
                and not isinstance(args[1], bool)
            ):
                args[1] = max(args[1], MIN_ROUND_DIGITS)
            try:
                return self._bounded(_FUNCTIONS[node.func.id](*args))
            except (TypeError, ValueError, OverflowError) as exc:
                raise ToolError(f'{node.func.id}({", ".join(map(str, args))}): {exc}') from None
        raise ToolError(f'not allowed in an arithmetic expression: {ast.unparse(node)!r}')

    @staticmethod
    def _check_size(op: ast.operator, left: int | float, right: int | float) -> None:
        """Refuse a power or product whose integer result would exceed `MAX_INT_BITS` before computing it."""
        if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left) > 1 and right * (abs(left).bit_length() - 1) > MAX_INT_BITS:
                raise ToolError(f'the result is too large (more than {MAX_INT_BITS} bits)')
        if isinstance(op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS + 1:
                raise ToolError(f'the result is too large (more than {MAX_INT_BITS} bits)')

    @staticmethod
    def _bounded(value: Any) -> int | float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToolError(f'not a real number: {value!r}')
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise ToolError(f'the result is too large (more than {MAX_INT_BITS} bits)')
        return value


class PythonTool(Tool):
    """Runs a Python program with ``python -I -u`` (isolated: no PYTHON* variables, no user site, no script directory
    on sys.path; unbuffered) in a fresh process per call and returns its stdout and stderr, interleaved as written,
    plus ``[exit status N]`` when it failed. Always sandboxed: under `ToolManager` the process runs inside the call's
    worker, with its limits, scrubbed environment and temporary cwd. Called directly (outside a sandbox) it only
    has a timeout (`timeout_s` + 5 s)."""

    name = 'python'
    description = (
        'Run a Python 3 program and return what it prints (stdout and stderr). Each call is a fresh process in an '
        'empty directory: nothing is kept between calls, so print what you need to see.'
    )
    parameters = {
        'type': 'object',
        'properties': {'code': {'type': 'string', 'description': 'The complete program to run.'}},
        'required': ['code'],
    }

    def __init__(self, timeout_s: float = 10.0, python: str | None = None) -> None:
        self.timeout_s = float(timeout_s)
        self.python = python or sys.executable

    def __call__(self, **arguments: Any) -> str:
        code = validate_arguments(self.parameters, arguments, self.name)['code']
        try:
            done = subprocess.run(
                [self.python, '-I', '-u', '-'],  # unbuffered: stdout and stderr interleave as written
                input=code.encode(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=self.timeout_s + 5,
            )
        except subprocess.TimeoutExpired:
            raise ToolError(f'the program did not finish within {self.timeout_s + 5:.1f} s') from None
        text = done.stdout.decode(errors='replace')
        if done.returncode:
            text = f'{text.rstrip()}\n[exit status {done.returncode}]'.lstrip()
        return text
