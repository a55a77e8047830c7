"""Strict JSON for run files: RFC 8259 has no NaN or Infinity, so no file a run writes does.

Two policies, chosen per file by its writer:

- ``dumps_nulled``: a non-finite number becomes null (records of what happened: metrics,
  events, spans). A metric that overflowed is unknown, not a reason to lose the run's log.
- ``dumps_refusing``: a non-finite number raises ``ValueError`` naming where it is (inputs
  that must reproduce the run: ``config.json``). A config that cannot be written as JSON
  cannot be resumed or compared, so the command refuses it before any work.

Both also turn what the standard library writes loosely into plain JSON numbers: a
``Fraction``, ``Decimal`` or numpy scalar becomes a float (an int stays an int), a tuple a
list, a non-string key a string, and any other object its ``str`` (as ``default=str`` did).
"""

from __future__ import annotations

import decimal
import json
import math
import numbers
from typing import Any


def dumps_nulled(obj: Any, **kwargs: Any) -> str:
    """``obj`` as strict JSON, every non-finite number written as null."""
    return json.dumps(_plain(obj, "", None), allow_nan=False, **kwargs)


def dumps_refusing(obj: Any, *, what: str, **kwargs: Any) -> str:
    """``obj`` as strict JSON; ``ValueError`` naming ``what`` and the field if a number in it
    is not finite (``config.json: lr=inf: ...``)."""

    def refuse(path: str, value: Any) -> None:
        raise ValueError(
            f"{what}: {path or 'value'}={value!r:.80}: not a finite number (strict JSON has no "
            "NaN or Infinity, and a run's config must be written to be resumed)"
        )

    return json.dumps(_plain(obj, "", refuse), allow_nan=False, **kwargs)


def _plain(value: Any, path: str, refuse: Any) -> Any:
    """``value`` with plain JSON types only; a non-finite number is None, or ``refuse(path,
    value)`` when given."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real | decimal.Decimal):
        try:
            number = float(value)
        except (OverflowError, ValueError):
            number = math.nan
        if math.isfinite(number):
            return number
        if refuse is not None:
            refuse(path, value)
        return None
    if isinstance(value, dict):
        return {
            _key(k): _plain(v, f"{path}.{k}" if path else str(k), refuse) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_plain(v, f"{path}[{i}]", refuse) for i, v in enumerate(value)]
    return str(value)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)  # what json.dumps itself writes for these keys
    return str(key)
