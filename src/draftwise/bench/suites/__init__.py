"""The bench's suites: the shipped prompt files (suites/<name>.jsonl, README.md says where each
came from), how a prompt file is read and padded (prompts), and what a suite's prompt asks of the
engine beyond its text: a suffix to fill in the middle of (fim), tools and tool_choice
(tool_calls)."""
