"""The Bokeh server: dashboard routes, the index page, JSON endpoints, and the Jupyter proxy entry point."""
