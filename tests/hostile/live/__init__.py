"""Live attacks: each starts a real job (or agent, or controller) and attacks it."""
