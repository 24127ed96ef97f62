"""A chaos campaign against the real controller, with an invariant checker (issue 11).

``python -m chaos --seed S --rounds R`` starts a stack of its own under a temporary directory
(a Temporal dev server on a SQLite file, an embedded Postgres, two ``python worker.py``
replicas on one task queue), drives a fleet of simulated agents and a stand-in scheduler,
injects faults at moments drawn from ``random.Random(S)`` (SIGKILLed replicas, Temporal and
Postgres restarts, locked tables, slow and terminated sessions) and checks, at every step and
after a final quiet period, the rules of CONTRACT.md §4 and §5 against the campaign's own log
of what each agent reported and when.

Modules, each readable in one sitting:

- ``settings``: the controller's short timings and every bound the checker derives from them;
- ``stack``: the processes (dev server, Postgres, replicas), killed and restarted;
- ``ledger``: the campaign's own log (beats, faults, inserts, retirements);
- ``agents``: simulated agents speaking the agent protocol (CONTRACT.md §2);
- ``scheduler``: the stand-in scheduler's inserts (CONTRACT.md §3);
- ``faults``: the faults, each a coroutine that ends by itself;
- ``plan``: what each round does, drawn from the seed;
- ``rules``: the invariants as pure functions over values (table-tested);
- ``observe``: what the checker reads from Postgres at every step;
- ``checker``: the rules applied to the ledger and the observations;
- ``settle``: what must hold after the final quiet period;
- ``histories``: failed workflow tasks in the Temporal histories;
- ``campaign``: the rounds, from start to the last line.
"""
