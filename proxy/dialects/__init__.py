"""The client dialects: Chat Completions, Responses and Anthropic Messages, in and out."""
