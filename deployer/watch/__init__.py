"""Watching a started run: the task board and its rules, host contact, the poll tick, the watch
loop and the live view."""
