"""The service: tenants' live models, sessions, futures, quotas, drain, checkpoints and the training and sampling
operations (`core.Service` and its collaborators). It enforces the rules (ownership, limits, ordering) that every
wire API shares, and queues work on the engine."""
