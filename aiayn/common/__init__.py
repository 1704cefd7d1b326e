"""Plumbing every layer shares: the user-error type, atomic files, secret masking, file locks, and
dataclass options that generate the command line. Imports nothing else of aiayn."""
