"""The explorer (`tokenlake serve`): a local web server over a lake's catalog.

Rooms: `server.py` (routes, the token, the headers every answer carries), `data.py` (what each
page reads, as JSON, through the catalog's views), `kept.py` (what the pages reuse, read once
per catalog version), `console.py` (the SQL console's sandbox and limits), `assets/` (the one
page and its script, bundled in the wheel).
"""
