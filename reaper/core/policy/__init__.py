"""Pure policy: values in, decisions out. Imports nothing of Temporal, Postgres or the rest of reaper but ``reaper.core``."""
