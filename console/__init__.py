"""The operator console: a Textual app that watches and steers a run over SSH."""
