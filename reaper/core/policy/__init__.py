"""Pure policy: values in, decisions out.

Imports nothing of Temporal or Postgres, and nothing of reaper outside ``reaper.core``.
"""
