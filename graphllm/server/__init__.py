"""OpenAI-compatible HTTP server: app, protocol, tool-call and reasoning parsers."""
