"""``python -m chaos --seed S --rounds R [--keep] [--peer-version 1.1]``: a chaos campaign
(see ``chaos``).

The last line is ``chaos: R rounds, K kills, D destroys, P reaps, V violations``; the exit
status is 1 when V > 0, 2 when the campaign itself could not run, 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import traceback

from chaos.campaign import Campaign
from chaos.settings import PEER_VERSION
from reaper.core.policy import rollout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="seed of random.Random (default 1)")
    parser.add_argument("--rounds", type=int, default=50, help="rounds to play (default 50)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (logs, data); kept anyway on a violation",
    )
    parser.add_argument(
        "--peer-version",
        choices=rollout.RELEASE_LINES,
        default=PEER_VERSION,
        help=f"the controllers' REAPER_PEER_VERSION: which workflow command changes they take"
        f" (default {PEER_VERSION}, as a fleet with nothing set)",
    )
    args = parser.parse_args(argv)
    campaign = Campaign(args.seed, args.rounds, keep=args.keep, peer_version=args.peer_version)

    async def run() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await campaign.run()

    try:
        return asyncio.run(run())
    except BaseException as exc:  # the campaign could not run: say so on the last line
        if not isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            traceback.print_exc()
        print(f"chaos: aborted ({type(exc).__name__}: {exc})", flush=True)
        return 2


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The Temporal SDK can abort at interpreter exit after all work is done
    # (docs/platform-notes.md).
    os._exit(status)
