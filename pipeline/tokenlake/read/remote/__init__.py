"""Dumps on an object store (`s3://…`): discovered through a sparse local stage, downloaded step
by step (`remote_dump.py`); the stage itself (`remote_stage.py`)."""
