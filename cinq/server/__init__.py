"""The OpenAI-compatible HTTP server (`cinq serve`): routes in app.py, request schemas in protocol.py."""
