"""State, events, engine, time, trainer and checkpoints: the event-driven core."""
