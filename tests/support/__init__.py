"""The shared kit of the tests: simulated agents, controllers, processes, rows and polling.

Test modules import from here (``tests.support.*``), never from one another nor from a
conftest; conftest files hold fixtures only.
"""
