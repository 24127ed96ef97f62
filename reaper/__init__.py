"""reaper: durable liveness and garbage collection for cluster orchestrators."""
