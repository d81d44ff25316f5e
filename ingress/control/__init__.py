"""What the control topic drives in a replica: the pause state, the pausable engine, the engine
pool and the follower of the control and ended-sessions topics."""
