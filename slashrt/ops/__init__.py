"""Operators: stateless steps, event-time windows with CRDT aggregates, sources and sinks."""
