"""The SQL read at run time (views, macros, audits), shipped inside the tokenlake package.

This folder stays at the top of the repository so the views can be read and run in the DuckDB
CLI; pyproject.toml maps it to the package `tokenlake.sql`, read with importlib.resources.
"""
