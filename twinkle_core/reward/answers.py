"""Reading answers out of completions and comparing them: \\boxed{}, answer tags, GSM8K ``####``, numbers.

Pure functions on strings, shared by the accuracy and format rewards.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError

NUMBER_PATTERN = r'[-\u2212]?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:/\d+(?:\.\d+)?)?'
_NUMBER = re.compile(NUMBER_PATTERN)
_FRAC = re.compile(r'^\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}$')
_TEXT = re.compile(r'\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}')
_LATEX_NOISE = ('\\left', '\\right', '\\!', '\\,', '\\;', '\\ ', '^\\circ', '^{\\circ}', '\\%', '%', '$', ' ')


def completion_text(trajectory: Any, index: int, who: str) -> str:
    """The completion of a Trajectory (dict or model): its last message's content, which must be the assistant's."""
    messages = trajectory.get('messages') if isinstance(trajectory, dict) else getattr(trajectory, 'messages', None)
    if not messages:
        raise InvalidInputError(
            f'{who}: trajectory {index} has no messages; append the sampled completion as the last (assistant) message.'
        )
    last = messages[-1]
    role = last.get('role') if isinstance(last, dict) else getattr(last, 'role', None)
    content = last.get('content') if isinstance(last, dict) else getattr(last, 'content', None)
    if role != 'assistant':
        raise InvalidInputError(
            f'{who}: the last message of trajectory {index} has role {role!r}; it must be the '
            "sampled completion with role 'assistant'."
        )
    return content or ''


def ground_truth(trajectory: Any, index: int, fields: Sequence[str], who: str) -> str:
    """The first present field of `fields` in the trajectory (e.g. ``ground_truth``, ``answer``), as a string."""
    get = trajectory.get if isinstance(trajectory, dict) else (lambda k: getattr(trajectory, k, None))
    for name in fields:
        value = get(name)
        if value is not None:
            return str(value)
    raise InvalidInputError(
        f'{who}: trajectory {index} has none of the ground-truth fields {list(fields)}; put the '
        'reference answer in one of them (or pass answer_fields=...).'
    )


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces allowed; None if absent."""
    start = max(text.rfind('\\boxed{'), text.rfind('\\fbox{'))
    if start < 0:
        return None
    i = text.index('{', start) + 1
    depth, begin = 1, i
    while i < len(text):
        depth += {'{': 1, '}': -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i].strip()
        i += 1
    return None  # unbalanced


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last ``<tag>...</tag>``; None if absent."""
    found = re.findall(rf'<{re.escape(tag)}>(.*?)</{re.escape(tag)}>', text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def extract_gsm8k_marker(text: str) -> str | None:
    """What follows the last GSM8K ``####`` marker (to the end of that line); None if absent."""
    if '####' not in text:
        return None
    tail = text.rsplit('####', 1)[1].strip()
    return tail.splitlines()[0].strip() if tail else ''


def extract_last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def parse_number(text: str | None) -> Fraction | float | None:
    """A number from an answer string: ``42``, ``-3.5``, ``1,000``, ``3/4``, ``\\frac{3}{4}``, ``50\\%``, ``$7``.

    Exact (`Fraction`) where possible; None when the string is not a single number.
    """
    if text is None:
        return None
    s = _TEXT.sub(r'\1', text.strip())
    for noise in _LATEX_NOISE:
        s = s.replace(noise, '')
    s = s.replace('\u2212', '-').rstrip('.')
    frac = _FRAC.match(s)
    if frac:
        num, den = parse_number(frac.group(1)), parse_number(frac.group(2))
        return None if num is None or den in (None, 0) else Fraction(num) / Fraction(den)
    if not re.fullmatch(NUMBER_PATTERN, s):
        return None
    s = s.replace(',', '')
    try:
        if '/' in s:
            top, bottom = s.split('/')
            return None if float(bottom) == 0 else Fraction(top) / Fraction(bottom)
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def normalize_answer(text: str) -> str:
    """A canonical string form for non-numeric answers (LaTeX spacing and wrappers removed, lower case)."""
    s = _TEXT.sub(r'\1', text.strip())
    for noise in _LATEX_NOISE:
        s = s.replace(noise, '')
    return s.replace('\\dfrac', '\\frac').replace('\\tfrac', '\\frac').rstrip('.').lower()


def answers_match(predicted: str | None, reference: str, rel_tol: float = 1e-6) -> bool:
    """Numeric equivalence when both parse as numbers, else equality of the normalised strings."""
    if predicted is None:
        return False
    a, b = parse_number(predicted), parse_number(reference)
    if a is not None and b is not None:
        return a == b or math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-9)
    return bool(normalize_answer(predicted)) and normalize_answer(predicted) == normalize_answer(reference)
