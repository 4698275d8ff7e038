"""Peer engines for `specctl bench`: the engines a user would pick instead of specctl."""
