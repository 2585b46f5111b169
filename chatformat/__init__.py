"""Chat formats in text: templates, tool-call and reasoning parsers (engine and token-in)."""
