"""docs/stale_clock_repro.py, the minimal reproduction of docs/stale-clock.md, run as written.

It asserts the SDK's *current* behaviour (temporalio 1.35): a query that races a timer or a
signal makes the workflow decide on the previous workflow task's clock, and the history it
writes does not replay; without the query (the control) it does. This keeps the page's
reproduction true, and tells whoever upgrades the SDK when the behaviour goes away: then this
test fails on the ``timer`` and ``beat`` cases, and reaper's guard (``StaleClock``) and repair
(activities/repair.py) may be reconsidered as docs/stale-clock.md says. (Not an ``xfail``: an
xfail would also pass when the script breaks for another reason.)

The three runs share the session's dev server, each on a task queue of its own, side by side
(each waits about 10 s on timers and a sticky queue's timeout).
"""

from __future__ import annotations

import asyncio
import sys

from tests.support.paths import ROOT

SCRIPT = ROOT / "docs" / "stale_clock_repro.py"


async def run(race: str, address: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        race,
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=90)
    except TimeoutError:
        proc.kill()
        raise AssertionError(f"{race}: the reproduction did not finish in 90 s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def test_the_minimal_reproduction_shows_the_stale_clock(dev_env) -> None:
    address = dev_env.client.service_client.config.target_host
    races = ("timer", "beat", "none")
    outcomes = await asyncio.gather(*(run(r, address) for r in races))
    results = dict(zip(races, outcomes, strict=True))
    for race, (code, out) in results.items():
        print(f"---- {race} (exit status {code})\n{out}")

    code, out = results["none"]
    assert code == 0 and "replay: the history replays" in out, out
    for race in ("timer", "beat"):
        code, out = results[race]
        # The racing query's answer ends with a wake-up at no time passed since the workflow
        # armed its 2 s timer (the previous task's clock), after which it waits again.
        answer = next(line for line in out.splitlines() if "racing query answered" in line)
        assert answer.endswith("]") and "'woke 0.000 s after" in answer.rsplit(", ", 1)[-1], out
        assert code == 1 and "[TMPRL1100] Nondeterminism error" in out, out
