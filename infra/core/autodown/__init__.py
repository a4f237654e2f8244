"""Autodown from this machine: the watcher's files on a head, and its report."""
