"""Fault injection: a multi-node local cluster run under a seeded stream of jobs while
processes are killed, paused and starved of disk, then checked from the database's
history (docs/faults.md)."""
