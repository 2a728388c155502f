"""One module per `provision` verb; provision/cli/__init__.py parses and dispatches."""
