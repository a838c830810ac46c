"""The report of a run: plots (PNG), one self-contained `report.html` read from the run directory alone, and the
same pieces as inline views for a notebook.

    vlrl report --run-dir runs/demo     # -> runs/demo/report.html and runs/demo/plots/{comparison,training}.png

    plots.py    plot_comparison, plot_pass_at_k, plot_training, training_series
    page.py     render -> report.html (CSP: no script, no network, images as data URIs)
    views.py    Html, items_html, completion_html, records_html, comparison_html, pass_at_k_html, flips_html,
                files_html, table_html, episodes_html (an episode run's filmstrips)
    episodes.py an episode run's verdict, statistics table and flipped episodes as filmstrips
    blocks.py   the HTML blocks page and views share (style, tables, data URIs, verdict, comparison, flipped items)
"""

from vlrl.report.blocks import EMBED_MAX_SIDE, STYLE
from vlrl.report.page import CSP, render
from vlrl.report.plots import plot_comparison, plot_pass_at_k, plot_training, training_series
from vlrl.report.views import (
    Html,
    comparison_html,
    completion_html,
    episodes_html,
    files_html,
    flips_html,
    items_html,
    pass_at_k_html,
    records_html,
    table_html,
)

__all__ = ["CSP", "EMBED_MAX_SIDE", "STYLE", "Html", "comparison_html", "completion_html", "episodes_html",
           "files_html", "flips_html", "items_html", "pass_at_k_html", "plot_comparison", "plot_pass_at_k",
           "plot_training", "records_html", "render", "table_html", "training_series"]
