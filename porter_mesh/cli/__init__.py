"""The ``porter-mesh`` command line. Each ``cmd_*.py`` module adds one sub-command."""
