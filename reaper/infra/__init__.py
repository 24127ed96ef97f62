"""The controller's connections below its activities: the Postgres pool and its schema
migrations (:mod:`reaper.infra.db`, ``migrations/*.sql``), the Temporal client and search
attributes (:mod:`reaper.infra.temporal`) and the Prometheus endpoints
(:mod:`reaper.infra.metrics_endpoint`). Nothing here is an activity or a workflow."""
