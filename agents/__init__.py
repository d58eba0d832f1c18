"""Example agent programs, each run as its own OS process."""
