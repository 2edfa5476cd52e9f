"""The rollout runtime: specs, the parallel runner, its worker processes and the episode loop (no Prefect)."""
