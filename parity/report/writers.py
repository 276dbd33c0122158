"""The report files every run folder gets beside summary.json: report.md and acceptance.png.

Each writer takes (folder, summary) as artifacts.write_run's `extra_writers` expects.
"""

from __future__ import annotations

from parity.report.markdown import write_markdown
from parity.report.plot import write_plot

RUN_REPORT_WRITERS = (write_markdown, write_plot)
