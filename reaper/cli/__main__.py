"""``python -m reaper.cli`` (how the demo starts its agents)."""

from reaper.cli import main

main()
