"""Servers side by side (`draftwise bench-serve --peer`): the same prompts through several
OpenAI-compatible servers one request at a time (peers), the servers as given on the command line
(peer_servers) and the report of each server's decode speed as a ratio to the first's
(peers_report)."""
