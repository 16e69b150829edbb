"""The orchestration layer: which deployment serves a request, what context the model sees, and what
need not be computed again (routing, fallback and roll-outs; conversation memory; caching)."""
