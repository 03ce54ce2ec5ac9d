"""The serving benchmark (`draftwise bench-serve`): C concurrent streaming clients against an
OpenAI-compatible server (load) and its report (load_report), users typing code as editors ask for
it (keystrokes), and the server processes a benchmark starts, `draftwise serve` or any command
line (serve_process)."""
