"""The benchmark and table-format experiments: tools, not part of the installed package."""
