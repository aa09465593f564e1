"""Orchestration: extraction, following, verification and the executors that run the stages."""
