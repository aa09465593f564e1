"""Stage 4, serve: reading a lake. The DuckDB catalog (`catalog.py`) over tokenlake's own SQL
(`sql_views.py`), the rollups (`rollups.py`) and the user's views (`user_views.py`, checked by
`user_view_check.py`); queries (`query.py`) and audits (`audit.py`); the HTML report
(`report.py`, `report_data.py`, `report_charts.py`, `report_html.py`).
"""

from __future__ import annotations
