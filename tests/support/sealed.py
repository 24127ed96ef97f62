"""Reports sealed as a liveness seals them (``activities.sealing``), for tests that call the
collector's activities directly. The controller's secret is installed by the ``pool``
fixture (``load_secret``)."""

from __future__ import annotations

from datetime import datetime

from activities import sealing
from activities.types import SealedReport
from reaper.core.protocol import report_digest


def sealed(
    worker: str,
    kind: str,
    handles: list[str],
    taken_at: datetime,
    boot_id: str = "boot-1",
    staged_id: str | None = None,
    digest: str | None = None,
) -> SealedReport:
    """The sealed fields of a report of ``handles`` (or of ``digest`` for a staged one)."""
    d = digest if digest is not None else report_digest(handles)
    r = SealedReport(digest=d, taken_at=taken_at, boot_id=boot_id, staged_id=staged_id)
    return r.model_copy(update={"seal": sealing.seal(worker, kind, r)})
