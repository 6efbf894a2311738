"""Every change the ops (and the plugin) make to vLLM's objects, made here: once per process, with what was
there before recorded, so that one op's changes (``undo(op)``) or all of them (``undo_all()``) can be taken
back and vLLM is as it was.

Two kinds of change, each under the name of the op that made it:

- ``wrap(op, owner, name, make)``: ``owner.name`` (a module's function, a class's method) becomes
  ``make(original)``, where ``original`` is ``getattr(owner, name)`` (bound, for a classmethod).
- ``register(op, owner, name, key, install)``: ``install()`` puts ``key`` into the dict ``owner.name`` (one of
  vLLM's registries) through vLLM's own call (``register_backend``, ``register_impl``, ``register_oot``), so
  whatever else that call checks still runs.

Both do nothing and return False when the same op already made that change in this process: ``activate``
may run again, and a forked child inherits its parent's changes together with these records. The owner and
the registry are looked up when the change is made, not at import: a name vLLM does not have raises, which
the plugin turns into the op's ``activate-error`` decline.

Undoing restores the owner's own entry as it was (removing it where there was none, so an inherited method
shows through again); a change that something else has replaced since is left in place and returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

_ABSENT = object()  # the owner had no entry of its own under that name


@dataclass
class Change:
    op: str
    owner: Any  # the module or class (wrap), the object holding the registry (register)
    name: str  # the attribute wrapped, or the registry's attribute name
    key: Any  # the registry key; _ABSENT for a wrap
    before: Any  # the owner's own entry before the change, or _ABSENT
    after: Any  # the entry the change put there

    def _table(self) -> dict:
        return vars(self.owner) if self.key is _ABSENT else getattr(self.owner, self.name)

    def _slot(self) -> Any:
        return self.name if self.key is _ABSENT else self.key

    def in_place(self) -> bool:
        return self._table().get(self._slot(), _ABSENT) is self.after

    def restore(self) -> None:
        if self.key is _ABSENT:
            if self.before is _ABSENT:
                delattr(self.owner, self.name)
            else:
                setattr(self.owner, self.name, self.before)
        else:
            table = getattr(self.owner, self.name)
            if self.before is _ABSENT:
                del table[self.key]
            else:
                table[self.key] = self.before

    def __str__(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", None) \
            or type(self.owner).__qualname__
        where = f"{getattr(self.owner, '__module__', '')}.{owner}" if isinstance(self.owner, type) else owner
        return f"{self.op}: {where}.{self.name}" + ("" if self.key is _ABSENT else f"[{self.key!r}]")


_changes: list[Change] = []  # in the order made


def _made(op: str, owner: Any, name: str, key: Any) -> bool:
    return any(c.op == op and c.owner is owner and c.name == name and
               (c.key is key if key is _ABSENT else c.key == key) for c in _changes)


def wrap(op: str, owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
    """``owner.name = make(getattr(owner, name))`` once per process for ``op``; True when it was made now.
    ``make`` returns what goes into the owner (wrap a classmethod's function in ``classmethod`` again)."""
    if _made(op, owner, name, _ABSENT):
        return False
    before = vars(owner).get(name, _ABSENT)
    setattr(owner, name, make(getattr(owner, name)))
    _changes.append(Change(op, owner, name, _ABSENT, before, vars(owner)[name]))
    return True


def register(op: str, owner: Any, name: str, key: Any, install: Callable[[], Any]) -> bool:
    """``install()`` once per process for ``op``: it must put ``key`` into the dict ``owner.name``; True when it
    was called now. Raises LookupError (the op then declines ``activate-error``) when it did not."""
    if _made(op, owner, name, key):
        return False
    table = getattr(owner, name)
    before = table.get(key, _ABSENT)
    install()
    if key not in table:
        raise LookupError(f"{install!r} put no {key!r} into {name}")
    _changes.append(Change(op, owner, name, key, before, table[key]))
    return True


def changes(op: str | None = None) -> list[Change]:
    """The changes in place, in the order made; only ``op``'s when given."""
    return [c for c in _changes if op is None or c.op == op]


def undo(op: str) -> list[Change]:
    """Take back ``op``'s changes, the latest first. Returns those left in place because something else
    replaced the entry since (restoring it would drop that)."""
    return _undo([c for c in _changes if c.op == op])


def undo_all() -> list[Change]:
    """Take back every op's changes, the latest first; returns those left in place (as ``undo``)."""
    return _undo(list(_changes))


def _undo(chosen: list[Change]) -> list[Change]:
    kept = []
    for change in reversed(chosen):
        if change.in_place():
            change.restore()
        else:
            kept.append(change)
        _changes.remove(change)
    return kept
