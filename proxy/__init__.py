"""The proxy harnesses talk to: dialects in, engines out, every call captured and recorded."""
