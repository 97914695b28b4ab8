"""Reading a JSON file so that every way it can fail is one typed error naming
the file: the standard parser also raises RecursionError for deep nesting and
ValueError for integer literals beyond Python's digit limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import RematoptError


def read_json(path: Path, error: type[RematoptError]) -> Any:
    """The parsed document at ``path``; ``error`` for a missing, binary or
    malformed file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a file") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}: malformed JSON at line {e.lineno} column {e.colno} ({e.msg})") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to read") from None
    except ValueError as e:  # an integer literal of thousands of digits
        raise error(f"{path}: unreadable JSON number ({e})") from None
