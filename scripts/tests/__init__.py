"""The Python test suite: /usr/bin/python3 -m pytest scripts (scripts/test.sh runs it)."""
