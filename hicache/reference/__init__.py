"""Reference models on hicache's own pools and `hicache verify-model` (nothing re-exported here:
`hicache.reference.cli` must import without torch)."""
