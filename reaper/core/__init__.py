"""The pure core of reaper: contract, settings, models and policy.

Imports no Temporal and no asyncpg (checked by import-linter, ``make check``).
"""
