"""Safe arithmetic for environments: evaluate an expression with `ast` (never `eval`), and read a number from text.

`evaluate` accepts numbers, parentheses, unary ``+``/``-`` and ``+ - * / // % **`` (``^`` is read as ``**``,
``×``/``÷`` as ``*``/``/``, and ``1,234`` as ``1234``); it computes exactly with `Fraction` and raises
`ArithError` (a message for the model) for anything else, a division by zero, or an oversized result.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_EXPRESSION_CHARS = 500
MAX_RESULT_DIGITS = 1000
MAX_EXPONENT = 1000

_THOUSANDS = re.compile(r'(?<=\d),(?=\d{3}(?!\d))')
_NUMBER = re.compile(r'(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?<![\w.])[-+]?\.\d+')
_BOXED = re.compile(r'\\boxed\{([^{}]*)\}')


class ArithError(ValueError):
    """The expression cannot be evaluated; the message says why, in words meant for the model."""


def _normalise(expression: str) -> str:
    text = expression.strip().replace('×', '*').replace('÷', '/').replace('^', '**').replace('−', '-')
    return _THOUSANDS.sub('', text)


def _check_size(value: Fraction) -> Fraction:
    if max(abs(value.numerator), value.denominator).bit_length() > MAX_RESULT_DIGITS * 3.33:
        raise ArithError(f'result too large (more than {MAX_RESULT_DIGITS} digits)')
    return value


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _eval(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        op = node.op
        if isinstance(op, ast.Add):
            return _check_size(left + right)
        if isinstance(op, ast.Sub):
            return _check_size(left - right)
        if isinstance(op, ast.Mult):
            return _check_size(left * right)
        if isinstance(op, ast.Div | ast.FloorDiv | ast.Mod):
            if right == 0:
                raise ArithError('division by zero')
            if isinstance(op, ast.Div):
                return left / right
            return Fraction(left // right) if isinstance(op, ast.FloorDiv) else left % right
        if isinstance(op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ArithError(f'exponents must be whole numbers of at most {MAX_EXPONENT}')
            if left == 0 and right < 0:
                raise ArithError('division by zero')
            if abs(left.numerator).bit_length() * abs(right) > MAX_RESULT_DIGITS * 3.33:
                raise ArithError(f'result too large (more than {MAX_RESULT_DIGITS} digits)')
            return _check_size(left ** int(right))
    raise ArithError(f'unsupported syntax {ast.unparse(node)!r}: use numbers, parentheses and + - * / // % **')


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic `expression`; `ArithError` for anything that is not plain arithmetic."""
    if not isinstance(expression, str) or not expression.strip():
        raise ArithError('expected a non-empty arithmetic expression, e.g. "123 * 456"')
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ArithError(f'expression longer than {MAX_EXPRESSION_CHARS} characters')
    try:
        tree = ast.parse(_normalise(expression), mode='eval')
    except SyntaxError as exc:
        raise ArithError(f'cannot parse {expression!r}: {exc.msg}') from None
    try:
        return _eval(tree)
    except RecursionError:
        raise ArithError('expression nested too deeply') from None


def format_number(value: Fraction) -> str:
    """``56088`` for a whole number, else a decimal with up to 12 significant digits (``0.333333333333``)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f'{float(value):.12g}'


def extract_number(text: str) -> Fraction | None:
    """The answer in free text: the last ``\\boxed{...}`` if any, else the last number (``1,234``, ``-5``, ``2.5``,
    ``1e3`` are read); None when there is none."""
    boxed = _BOXED.findall(text)
    for candidate in ([boxed[-1]] if boxed else []) + [text]:
        found = _NUMBER.findall(candidate)
        if found:
            return Fraction(found[-1].replace(',', ''))
    return None
