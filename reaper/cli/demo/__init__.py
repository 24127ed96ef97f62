"""``reaper demo``: one finite end-to-end run on a private embedded stack.

It starts its own Temporal dev server (free ports), Postgres and controller under a temporary
directory, so it can run beside ``reaper run``; then three ``reaper agent`` processes (the third
with ``--retire-on-stop``), a service of three tasks (one per agent) and a container and a
volume per agent. Then:

a. one agent loses a volume entry: the row is destroyed once it has been missing as long as a
   volume waits (``policy.collection.destroy_after``), and not before;
b. another agent is killed with SIGKILL: its worker goes ``stalled``, then ``lost``; its task
   becomes ``lost`` and a replacement runs on a surviving agent;
c. the killed agent comes back (new boot id, same directory, so it still holds its old task):
   the reaped task is in its ``orphans``, the agent removes it, and the service has exactly
   three running tasks;
d. scale-in: the third agent is stopped and, with ``--retire-on-stop``, retires its worker: its
   task becomes ``lost`` (``worker-retired``) and a replacement is placed on a survivor at once
   (no ``LOST_AFTER`` wait), the ``workers`` row is ``retired``;
e. scale-out with owed work: the two remaining workers are drained (``reaper drain``), one is
   retired (``reaper retire``), so its replacements are owed (``pending``, no worker); a new
   agent with a fresh directory joins, the owed tasks are placed on it and it starts them: the
   service is back at three, with exactly three active tasks.

Every outcome is polled for with a deadline; the command exits 0 only if all were observed.
Modules: ``runner`` (stack, scenario, cleanup), ``session`` (what a run holds, how it waits),
``steps`` (the seed and steps a-e).
"""

from reaper.cli.demo.runner import run_demo

__all__ = ["run_demo"]
