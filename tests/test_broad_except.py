"""Broad exception handlers (``except Exception``, ``except BaseException``, bare ``except``):
each one records or re-raises what it caught, and says why on its line. A handler that drops
a ``BaseException`` silently swallows ``CancelledError`` and ``KeyboardInterrupt``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROAD = {"Exception", "BaseException"}
NOT_YET: set[str] = set()


def _caught(handler: ast.ExceptHandler) -> set[str]:
    t = handler.type
    if t is None:
        return {"BaseException"}
    names = t.elts if isinstance(t, ast.Tuple) else [t]
    return {n.id for n in names if isinstance(n, ast.Name)} & BROAD


def _records_or_raises(handler: ast.ExceptHandler) -> bool:
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if handler.name and isinstance(node, ast.Name) and node.id == handler.name:
            return True  # the exception is kept, logged or handed on
        if isinstance(node, ast.Attribute) and node.attr in ("exception", "format_exc"):
            return True  # logger.exception / traceback.format_exc record it
        if isinstance(node, ast.keyword) and node.arg == "exc_info":
            return True  # logger.info(..., exc_info=True) records it
    return False


def test_broad_handlers_record_or_reraise_and_say_why():
    bad = []
    for package in ("pipelines", "graph", "gpu"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in NOT_YET:
                continue
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ExceptHandler) or not _caught(node):
                    continue
                line = lines[node.lineno - 1]
                if not _records_or_raises(node):
                    bad.append(f"{rel}:{node.lineno}: drops what it caught: {line.strip()}")
                elif "#" not in line:
                    bad.append(f"{rel}:{node.lineno}: no reason comment: {line.strip()}")
    assert bad == []
