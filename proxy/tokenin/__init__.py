"""Token-in mode: a conversation's next prompt is built from the ids the engine already saw.

lineage.py finds the earlier answer a request continues; bridge.py renders the ids between that
answer and the next; route.py sends the prompt to the engine's token-in route and reads the
answer back as chat, split by parse.py's parsers; answer.py decides per call; config.py holds
a proxy's settings of the mode.
"""
