"""The pure core of reaper: contract, settings, models and policy. Imports no Temporal, no asyncpg."""
