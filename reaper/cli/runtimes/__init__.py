"""Where an agent's handles live: the runtimes behind ``reaper agent --runtime``.

A runtime answers three questions for the agent (:mod:`reaper.cli.agent`), which speaks the
contract and knows nothing of how a host holds things:

- :meth:`Runtime.inventory`: the complete list of handles held now, per kind of
  :data:`~reaper.core.contract.KINDS`; ``None`` for a kind it could not read (CONTRACT.md §2:
  absent or ``null`` is "not reported in this heartbeat", liveness only; ``[]`` is "I hold
  none"). A failed read is never an empty list.
- :meth:`Runtime.remove`: destroy one orphan (``orphans_by_kind`` of the ``state`` query).
- :meth:`Runtime.start`: start one assigned task (``assignments``).

Implementations: ``directory`` (:mod:`.directory`: a directory of files, the default) and
``docker`` (:mod:`.docker`: containers and volumes of a Docker Engine API, Docker or Podman).
"""

from __future__ import annotations

from typing import Protocol

Inventory = dict[str, list[str] | None]
"""Kind (``containers``, ``volumes``, ``tasks``) -> the complete list held, or ``None`` when
that kind could not be read this time."""


class Runtime(Protocol):
    """What the agent needs of a host. Every method is idempotent: the controller lists the
    same assignments and orphans on every ``state`` answer until a report shows them done."""

    def describe(self) -> str:
        """Where the handles live, for the agent's start-up log line."""
        ...

    async def inventory(self) -> Inventory:
        """The complete lists held now, per kind (``None``: could not be read). Never raises."""
        ...

    async def remove(self, kind: str, handle: str) -> bool:
        """Destroy ``handle`` of ``kind`` if this runtime holds it.

        Returns:
            True if something was removed now; False if nothing was there, or the removal
            was refused or failed (logged; the next ``state`` answer lists it again).
        """
        ...

    async def start(self, task_id: str) -> bool:
        """Start assigned task ``task_id`` unless it is started already.

        Returns:
            True if it was started now; False if it was there already or could not be
            started (logged).
        """
        ...

    async def close(self) -> None:
        """Release what the runtime holds open (connections); called once, at the end."""
        ...


__all__ = ["Inventory", "Runtime"]
