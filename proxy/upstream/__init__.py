"""The engine side of a call: backends, routing, forwarding, resume, and the record it becomes."""
