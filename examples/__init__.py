"""Example tasks shipped with rolltap (Harbor format); `rolltap demo` runs a few of them."""
