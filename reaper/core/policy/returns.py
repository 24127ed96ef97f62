"""What a worker's return does to its marks (CONTRACT.md rule 4): time stalled or lost does
not count, so a return clears every ``missing_since`` of the worker once, and only reports
taken after it decide. ``activities/liveness.py`` asks it when it records a state.

Pure: values in, a verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reaper.core.contract import WorkerState
from reaper.core.states import WORKERS


@dataclass(frozen=True)
class ReturnMarks:
    """What recording a worker's state does to its marks (rule 4).

    Attributes:
        clear: clear every ``missing_since`` of the worker now: it returned.
        restamp: the return was a silence the liveness could not judge in time (a busy
            controller; the row still shows the state it returned to): move the row's
            ``state_since`` to the return, so reports taken before it are skipped.
        cleared: this return's marks are cleared, now or by an earlier attempt of the same
            record (the liveness then shows no missing handles until the next report).
    """

    clear: bool = False
    restamp: bool = False
    cleared: bool = False


def marks_at_record(
    recorded: WorkerState | str | None,
    recorded_since: datetime | None,
    new: WorkerState | str,
    returned_at: datetime | None,
) -> ReturnMarks:
    """Whether recording ``new`` over the row's ``recorded`` state (``None``: a new worker)
    is a return that clears the worker's marks (CONTRACT.md rule 4: time stalled or lost
    does not count; the first complete report after the return decides).

    A return is a record into a deciding state (``running``) from one whose reports did not
    decide (``stalled``, ``lost``: ``states.WORKERS``, time there does not count), or, with
    ``returned_at`` (the liveness judged a beat after ``STALL_AFTER`` of silence a return),
    one whose row already shows that state since before the return: a silence the liveness
    could not judge in time. A record that carries ``returned_at`` over a row whose marks
    were cleared already (a retry of the same record) clears nothing more.

    Args:
        recorded: the row's state before this record (``None``: no row).
        recorded_since: the row's ``state_since`` (UTC).
        new: the state recorded.
        returned_at: the return this record writes (UTC), ``None`` if none.
    """
    if recorded is None or not WORKERS[WorkerState(new)].decides:
        return ReturnMarks()
    unjudged = (
        returned_at is not None
        and WorkerState(recorded) is WorkerState(new)
        and recorded_since is not None
        and recorded_since < returned_at
    )
    if not WORKERS[WorkerState(recorded)].decides or unjudged:
        return ReturnMarks(clear=True, restamp=unjudged, cleared=True)
    return ReturnMarks(cleared=returned_at is not None)
