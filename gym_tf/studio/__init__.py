"""The studio: web pages over a workspace showing what was learned, from where, and whether it helped.

Served by `gym-tf serve` under `/ui` and alone by `gym-tf ui`. Every page has a JSON twin at its URL + `.json`.

    queries.py   one function per page: SQL over the workspace, plain JSON-ready values
    charts.py    the run curve as inline SVG, drawn on the server
    app.py       the routes, auth (API keys; an admin key for actions) and the promote / roll back actions
    templates/   Jinja templates, one per page
    static/      the one stylesheet (no JavaScript, nothing fetched from elsewhere)
"""

from gym_tf.studio.app import StudioConfig, create_studio, favicon, studio_app

__all__ = ["StudioConfig", "create_studio", "favicon", "studio_app"]
